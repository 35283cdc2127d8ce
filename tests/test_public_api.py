"""The public surface, pinned: each public package's ``__all__`` and the count of explicit
``Any`` in kubevol's annotations (which may only go down)."""

from __future__ import annotations

import ast
import importlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

KUBEVOL = Path(__file__).resolve().parent.parent / "kubevol"
GENERATED = KUBEVOL / "csi" / "_generated"

# sorted(__all__) of every public package that defines one (kubevol.csidriver.drivers has
# none: it documents its modules instead). Generated once from the code, then kept by hand.
EXPECTED: dict[str, list[str]] = {
    "kubevol": [
        "APIObjectSource", "APITokenProvider", "AmbiguousPluginError", "AtomicWriter",
        "AttachDetachVolumeHost", "AttachableVolumePlugin", "Attacher", "Attributes",
        "BlockVolume", "BlockVolumeMapper", "BlockVolumePlugin", "BlockVolumeUnmapper",
        "BulkVolumeVerifier", "CSIVolumePhase", "CSI_VOLUME_PUBLISHED", "CSI_VOLUME_STAGED",
        "CachedMetrics", "CommandTokenProvider", "ConfigMap", "CorruptedMountError",
        "CustomBlockVolumeMapper", "CustomBlockVolumeUnmapper", "DeletableVolumePlugin", "Deleter",
        "Detacher", "DeviceMountableVolumePlugin", "DeviceMounter", "DeviceMounterArgs",
        "DeviceUnmounter", "DiskUsage", "DynamicPluginProber", "ENTRY_POINT_GROUP",
        "ExpandableVolumePlugin", "FSGroupChangePolicy", "FileProjection", "FilesystemErrorsError",
        "FilesystemMismatchError", "GuardPolicy", "HostPathTypeError", "InvalidPathSegmentError",
        "InvalidPayloadPathError", "IssuedToken", "KubeAPIObjects", "KubeletVolumeHost",
        "KubevolError", "LinuxMounter", "ManifestObjects", "Metrics", "MetricsBlock", "MetricsDu",
        "MetricsError", "MetricsErrorCode", "MetricsNil", "MetricsProvider", "MetricsStatFS",
        "MountError", "MountInfo", "MountRef", "Mounter", "MounterArgs",
        "NodeExpandableVolumePlugin", "NodeResizeOptions", "NodeVolumeHost", "ObjectNotFoundError",
        "OperationError", "PersistentVolumePlugin", "PluginNotFoundError", "PluginRoles",
        "PluginValidationError", "ProbeError", "ProbeEvent", "ProbeOperation",
        "ProvisionableVolumePlugin", "Provisioner", "ReconstructedVolume",
        "RecyclableVolumePlugin", "RefKind", "SafeFormatAndMount", "Secret", "Spec", "SpecError",
        "TokenManager", "TokenProvider", "TokenRequest", "TransientOperationError",
        "UncertainProgressError", "UnformattedReadOnlyError", "UnmountGuard", "UnmountVerdict",
        "Unmounter", "VOLUME_PARAMETER_FS_TYPE", "Volume", "VolumeConfig", "VolumeHost",
        "VolumeOptions", "VolumePlugin", "VolumePluginMgr", "VolumePluginWithAttachLimits",
        "__version__", "check_unmount_device", "cleanup_mount_point", "disk_usage",
        "entry_point_plugins", "escape_plugin_name", "is_corrupted_mount", "is_not_supported",
        "is_operation_finished", "new_persistent_volume_recycler_pod_template", "parse_mountinfo",
        "parse_mountinfo_text", "path_exists", "set_volume_ownership", "unescape_plugin_name",
        "validate_path_segment", "validate_recycler_pod_template",
    ],
    "kubevol.csi": [
        "CSIClient", "CSIEndpointError", "CSIRPCError", "CSIRPCUncertainError", "CSIServeError",
        "DEFAULT_TIMEOUT",
    ],
    "kubevol.plugins": [
        "CONFIG_MAP_PLUGIN_NAME", "ConfigMapPlugin", "DOWNWARD_API_PLUGIN_NAME",
        "DownwardAPIPlugin", "EMPTY_DIR_PLUGIN_NAME", "EmptyDirPlugin", "HOST_PATH_PLUGIN_NAME",
        "HostPathPlugin", "LOCAL_VOLUME_PLUGIN_NAME", "LocalVolumePlugin", "PROJECTED_PLUGIN_NAME",
        "ProjectedPlugin", "SECRET_PLUGIN_NAME", "SecretPlugin", "builtin_plugins",
    ],
    "kubevol.plugins.csi": [
        "CSIAttacher", "CSIBlockMapper", "CSIDriverInfo", "CSIMetrics", "CSIMounter", "CSIPlugin",
        "CSIVolumeSource", "CSI_PLUGIN_NAME", "DirectAttachBackend", "DriverNotRegisteredError",
        "DriverRegistry", "KubernetesCSIDrivers", "LocalCSIDrivers", "PluginWatcher",
        "RegistrationServer", "VOL_DATA_FILE", "VolumeAttachmentBackend", "VolumeDataError",
        "VolumeDataMissingError", "attach_limit_key", "csi_access_mode", "csi_source",
        "device_mount_path", "ephemeral_volume_handle", "load_volume_data", "map_block_volume",
        "pod_mount_path", "remove_mount_dir", "save_volume_data", "serve_registration",
        "split_volume_name", "unmap_block_volume", "volume_capability", "volume_name",
    ],
    "kubevol.mount": [
        "CORRUPTED_MOUNT_ERRNOS", "GuardPolicy", "LinuxMounter", "MountInfo", "MountInterface",
        "MountPoint", "MountRef", "MountTable", "MountTableCache", "PROC_MOUNTINFO", "RefKind",
        "SafeFormatAndMount", "UnmountGuard", "UnmountVerdict", "check_unmount_device",
        "cleanup_mount_point", "get_mount_refs", "is_corrupted_error", "is_corrupted_mount",
        "kubelet_refs_verdict", "map_block_device", "parse_mountinfo", "parse_mountinfo_bytes",
        "parse_mountinfo_line", "parse_mountinfo_text", "path_exists", "read_mountinfo_bytes",
        "remove_tree_on_one_device", "search_mount_points", "unmap_block_device",
    ],
    "kubevol.metrics": [
        "CachedMetrics", "DiskUsage", "FsInfo", "Metrics", "MetricsBlock", "MetricsDu",
        "MetricsError", "MetricsErrorCode", "MetricsNil", "MetricsProvider", "MetricsStatFS",
        "disk_usage", "fs_info", "is_not_supported",
    ],
    "kubevol.node": [
        "ActualState", "AttachedVolume", "DesiredPod", "DesiredState", "FailedVolume",
        "FoundVolume", "Manifests", "MountCheck", "MountState", "MountedVolume", "NewPod",
        "NodeVolumeManager", "OperationBackoffError", "OperationExecutor", "OperationFailure",
        "OperationGenerator", "OperationKey", "OperationKind", "OperationPendingError",
        "OrphanDeviceMount", "Ownership", "PodRecord", "PodRecords", "PodState", "PodVolumeDir",
        "PrivilegeError", "Reconciler", "Reconstruction", "ReconstructionError", "ScanPass",
        "SyncResult", "Verdict", "VolumeInUseError", "VolumeMode", "VolumeToMount", "VolumeUsage",
        "desired_pod", "list_pod_volume_dirs", "load_manifest_files", "manifest_pod_uid",
        "new_pods", "operation_key", "parse_manifests", "reconstruct_pod_volume", "scan",
        "volume_to_mount",
    ],
    "kubevol.nomad": [
        "ALLOC_DIR_NAME", "AccessMode", "AttachmentCancelledError", "AttachmentDirectory",
        "AttachmentMode",
        "AttachmentRecords", "AttachmentSource", "AttachmentTimeoutError", "AttachmentWaiter",
        "CSIInfo", "CSIManager", "CSIVolume", "CheckMethod", "ControllerFingerprint",
        "DEFAULT_FINGERPRINT_INTERVAL", "DEFAULT_MOUNT_ACTION_TIMEOUT", "DEFAULT_RESYNC_PERIOD",
        "EventSubscription", "ExpansionNotSupportedError", "Fingerprinter", "HealthState",
        "InstanceManager", "Manager", "ManagerConfig", "ManagerShutdownError", "ManagerStateError",
        "MountInfo", "MountOptions", "MountPropagation", "MountPropagationError", "NodeController",
        "NodeEvent", "NodeFingerprint", "PluginManager", "PluginRegistry", "PluginSupervisor",
        "PluginTaskConfig", "PluginType", "PluginUnhealthyError", "PluginVolumeState",
        "PluginWaitTimeoutError", "RegisteredPlugin", "RegistryEvent", "RegistryEventType",
        "RetryPolicy", "STAGING_DIR_NAME", "TaskEvent", "TaskEventType", "TaskMount",
        "TriggerNodeEvent", "UnmountFailure", "UpdateNodeCSIInfoFunc", "UsageOptions",
        "UsageTracker", "VolumeChecker", "VolumeHealth", "VolumeKey", "VolumeManager",
        "VolumeMounter", "VolumeNotPublishedError", "WAIT_BACKOFF",
    ],
    "kubevol.testing": [
        "FakeAction", "FakeCSIManager", "FakeMounter", "FakeNodeController", "FakeNomadCall",
        "FakeVolumePlugin", "fake_plugin_with",
    ],
    "kubevol.csidriver.server": [
        "CSIService", "CallInfo", "ControllerService", "DEFAULT_GRACE", "GroupControllerService",
        "IdentityService", "Middleware", "Mode", "NodeService", "PluginInfoOverride",
        "ServerConfig", "ServerConfigError", "ServerHandle", "SnapshotMetadataService",
        "StoragePlugin", "current_request_id", "parse_plugin_info", "serve", "serve_in_background",
    ],
}

PINNED_MESSAGE = "a public name was added or removed: update the list here and CHANGELOG.md"


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_public_names_are_pinned(package: str) -> None:
    """A package's ``__all__`` is exactly the pinned list, without duplicates, and every name
    in it resolves (lazy packages import their modules here)."""
    module = importlib.import_module(package)
    public: list[str] = list(module.__all__)
    added = sorted(set(public) - set(EXPECTED[package]))
    removed = sorted(set(EXPECTED[package]) - set(public))
    assert sorted(public) == sorted(EXPECTED[package]), (
        f"{PINNED_MESSAGE} ({package}: added {added}, removed {removed})"
    )
    assert len(public) == len(set(public)), f"{package}.__all__ names something twice"
    missing = [name for name in public if not hasattr(module, name)]
    assert missing == [], f"{package}.__all__ names what does not resolve: {missing}"


# Explicit `Any` in kubevol's annotations. Issue 34's target is under 100; the day this test
# was written (2026-11-27) the count was 640; 623 on 2026-11-28, then 205, then 71. Lower the
# ceiling whenever the count drops; never raise it.
ANY_CEILING = 71


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    )


def _any_in(expr: ast.expr | None) -> int:
    """`Any` in a type expression, including inside subscripts and quoted annotations."""
    if expr is None:
        return 0
    count = 0
    for node in ast.walk(expr):
        if _is_any(node):
            count += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                quoted = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            count += _any_in(quoted)
    return count


def _is_type_alias(annotation: ast.expr) -> bool:
    return (isinstance(annotation, ast.Name) and annotation.id == "TypeAlias") or (
        isinstance(annotation, ast.Attribute) and annotation.attr == "TypeAlias"
    )


def _is_cast(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "cast") or (
        isinstance(func, ast.Attribute) and func.attr == "cast"
    )


def _type_expressions(tree: ast.Module) -> Iterator[ast.expr | None]:
    """Every place a type is written: parameter and return annotations, annotated
    assignments (an explicit ``TypeAlias``'s value too), module-level aliases written as
    plain assignments (``Message = Any``), and the type given to ``cast``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                yield arg.annotation
            yield args.vararg.annotation if args.vararg else None
            yield args.kwarg.annotation if args.kwarg else None
            yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation
            if _is_type_alias(node.annotation):
                yield node.value
        elif isinstance(node, ast.Call) and _is_cast(node.func) and node.args:
            yield node.args[0]
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and isinstance(
            statement.value, ast.Name | ast.Attribute | ast.Subscript | ast.BinOp
        ):
            yield statement.value


def count_any() -> Counter[str]:
    """Explicit `Any` per module of kubevol/ (generated code left out)."""
    counts: Counter[str] = Counter()
    for path in sorted(KUBEVOL.rglob("*.py")):
        if path.is_relative_to(GENERATED):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found = sum(_any_in(expr) for expr in _type_expressions(tree))
        if found:
            counts[path.relative_to(KUBEVOL.parent).as_posix()] = found
    return counts


@pytest.mark.slow
def test_explicit_any_only_goes_down() -> None:
    """kubevol's explicit `Any` count stays at or under the ceiling, and the counter sees
    some (so the test cannot pass by counting nothing)."""
    counts = count_any()
    total = sum(counts.values())
    top = "\n".join(f"  {n:4d} {module}" for module, n in counts.most_common(10))
    assert total > 0, "the Any counter found nothing: it is broken, not the code clean"
    assert total <= ANY_CEILING, (
        f"{total} explicit Any in kubevol/ (ceiling {ANY_CEILING}); the most:\n{top}"
    )
