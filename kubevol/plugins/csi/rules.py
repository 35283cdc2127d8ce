"""The kubelet's rules the CSI plugin applies, as small pure functions: pod information,
lifecycle modes, fsGroup, attach-limit names, and the cleanup of a mount directory."""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
from collections.abc import Callable, Sequence

from kubevol.host import VolumeHost
from kubevol.k8s.pod import Pod
from kubevol.k8s.tokens import DEFAULT_EXPIRATION_SECONDS, IssuedToken, TokenRequest
from kubevol.layout import CSI_VOL_DATA_FILE, CSI_VOL_DATA_TEMP_PREFIX, is_below
from kubevol.plugins.csi.driverinfo import (
    LIFECYCLE_EPHEMERAL,
    LIFECYCLE_PERSISTENT,
    CSIDriverInfo,
    DriverTokenRequest,
    FSGroupPolicy,
)
from kubevol.plugins.csi.source import READ_WRITE_ONCE, CSIVolumeSource, SecretRef
from kubevol.util import fdtree

#: Kubernetes' prefix of CSI attach-limit resource names, and their length limit.
CSI_ATTACH_LIMIT_PREFIX = "attachable-volumes-csi-"
RESOURCE_NAME_LENGTH_LIMIT = 63

#: Keys the kubelet adds to the volume context of drivers with ``podInfoOnMount``.
POD_NAME_KEY = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE_KEY = "csi.storage.k8s.io/pod.namespace"
POD_UID_KEY = "csi.storage.k8s.io/pod.uid"
SERVICE_ACCOUNT_KEY = "csi.storage.k8s.io/serviceAccount.name"
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"
#: The key of the pod's service-account tokens for a driver with ``tokenRequests``.
SERVICE_ACCOUNT_TOKENS_KEY = "csi.storage.k8s.io/serviceAccount.tokens"


def attach_limit_key(driver: str) -> str:
    """``attachable-volumes-csi-<driver>``, shortened with a sha1 when over 63 characters
    (Kubernetes' ``GetCSIAttachLimitKey``)."""
    if len(CSI_ATTACH_LIMIT_PREFIX) + len(driver) >= RESOURCE_NAME_LENGTH_LIMIT:
        digest = hashlib.sha1(driver.encode()).hexdigest()[:16]
        return CSI_ATTACH_LIMIT_PREFIX + driver[:23] + digest
    return CSI_ATTACH_LIMIT_PREFIX + driver


def pod_info_attributes(pod: Pod, lifecycle_mode: str) -> dict[str, str]:
    """The ``csi.storage.k8s.io/*`` keys of a ``V1Pod`` for a driver with ``podInfoOnMount``."""
    meta = getattr(pod, "metadata", None)
    spec = getattr(pod, "spec", None)
    return {
        POD_NAME_KEY: str(getattr(meta, "name", "") or ""),
        POD_NAMESPACE_KEY: str(getattr(meta, "namespace", "") or ""),
        POD_UID_KEY: str(getattr(meta, "uid", "") or ""),
        SERVICE_ACCOUNT_KEY: str(getattr(spec, "service_account_name", "") or ""),
        EPHEMERAL_KEY: "true" if lifecycle_mode == LIFECYCLE_EPHEMERAL else "false",
    }


def service_account_tokens(
    pod: Pod, requests: Sequence[DriverTokenRequest],
    get_token: Callable[[TokenRequest], IssuedToken],
) -> str:
    """The value of :data:`SERVICE_ACCOUNT_TOKENS_KEY`: for each of the driver's token
    requests, a token of the pod's service account bound to the pod, as JSON by audience
    (each a TokenRequest status: ``token`` and ``expirationTimestamp``), as the kubelet's
    ``podServiceAccountTokenAttrs`` writes it. ``get_token`` is the host's (cached) issuer."""
    meta = getattr(pod, "metadata", None)
    namespace = str(getattr(meta, "namespace", "") or "default")
    account = str(getattr(getattr(pod, "spec", None), "service_account_name", "") or "default")
    out: dict[str, dict[str, str]] = {}
    for wanted in requests:
        issued = get_token(TokenRequest(
            namespace=namespace, service_account=account,
            audiences=(wanted.audience,) if wanted.audience else (),
            expiration_seconds=wanted.expiration_seconds or DEFAULT_EXPIRATION_SECONDS,
            pod_name=str(getattr(meta, "name", "") or ""),
            pod_uid=str(getattr(meta, "uid", "") or ""),
        ))
        out[wanted.audience] = {
            "token": issued.token,
            "expirationTimestamp": issued.expiration.astimezone(datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"),
        }
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def lifecycle_mode_problem(info: CSIDriverInfo | None, mode: str, driver: str) -> str | None:
    """Why ``driver`` cannot serve a volume in ``mode``, or None when it can."""
    if info is None:
        if mode == LIFECYCLE_PERSISTENT:
            return None  # no CSIDriver object: fine for persistent volumes, and only those
        return f'volume mode "{mode}" not supported by driver {driver} (no CSIDriver object)'
    if info.supports_lifecycle_mode(mode):
        return None
    return (
        f'volume mode "{mode}" not supported by driver {driver} '
        f"(only supports {list(info.volume_lifecycle_modes)})"
    )


def fs_group_policy(info: CSIDriverInfo | None) -> FSGroupPolicy:
    """The driver's fsGroup policy; ``ReadWriteOnceWithFSType`` without a CSIDriver object.

    Raises ValueError for an object with no policy (an API server always sets one).
    """
    if info is None:
        return FSGroupPolicy.READ_WRITE_ONCE_WITH_FS_TYPE
    if info.fs_group_policy is None:
        raise ValueError("expected valid fsGroupPolicy, received nil value or empty string")
    return info.fs_group_policy


def kubelet_applies_fs_group(
    source: CSIVolumeSource, fs_group: int | None, policy: FSGroupPolicy, read_only: bool
) -> bool:
    """Whether the kubelet itself changes ownership to ``fs_group`` after publishing
    (when the driver lacks VOLUME_MOUNT_GROUP)."""
    if fs_group is None or policy is FSGroupPolicy.NONE or read_only:
        return False
    if policy is FSGroupPolicy.FILE:
        return True
    if not source.fs_type:
        return False
    if source.ephemeral:
        return True  # inline volumes are always mounted ReadWriteOnce
    return READ_WRITE_ONCE in source.access_modes


def remove_mount_dir(host: VolumeHost, mount_path: str) -> None:
    """The kubelet's ``removeMountDir``: when ``mount_path`` is not a mount point, remove it,
    the ``vol_data.json`` beside it and their parent directory. Absent pieces are fine.

    A mounted path is left alone. Raises ``OSError`` when a directory is not empty or the
    mount check fails (a corrupted mount): data is never deleted. Every removal is made
    relative to a descriptor of the volume directory, opened (below the kubelet root) without
    following a link: a link put at the volume or pod directory is refused
    (:class:`~kubevol.errors.UnsafePathError`) and nothing is removed where it points.
    """
    try:
        mounted = not host.get_mounter().is_likely_not_mount_point(mount_path)
    except FileNotFoundError:
        mounted = False
    if mounted:
        return
    root = os.path.dirname(host.get_pods_dir().rstrip("/"))
    beneath = root if is_below(mount_path, root) else None
    volume_dir, mount_name = os.path.split(os.path.normpath(mount_path))
    with contextlib.ExitStack() as stack:
        try:
            grand_fd, volume_name, volume_fd = stack.enter_context(
                fdtree.opened_with_parent(volume_dir, beneath=beneath)
            )
        except FileNotFoundError:
            return  # gone already
        with host.get_mounter().removing_mount_point(os.path.normpath(mount_path)):
            _remove_at(os.rmdir, mount_name, volume_fd, mount_path)
        _remove_at(os.unlink, CSI_VOL_DATA_FILE, volume_fd,
                   os.path.join(volume_dir, CSI_VOL_DATA_FILE))
        _remove_volume_dir(grand_fd, volume_name, volume_fd, volume_dir)


def _remove_volume_dir(parent_fd: int, name: str, dir_fd: int, path: str) -> None:
    """rmdir the volume directory ``name`` (``dir_fd``, ``path``) in ``parent_fd``. A writer
    of ``vol_data.json`` killed mid-write leaves its temporary file, which is ours: looked
    for only when the directory is not empty, not listed in every removal."""
    try:
        _remove_at(os.rmdir, name, parent_fd, path)
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY or not _remove_temp_files(dir_fd):
            raise
        _remove_at(os.rmdir, name, parent_fd, path)


def _remove_temp_files(dir_fd: int) -> bool:
    """Remove the ``vol_data.json`` writers' temporary files in ``dir_fd``; whether any."""
    found = False
    for name in os.listdir(dir_fd):
        if name.startswith(CSI_VOL_DATA_TEMP_PREFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
            found = True
    return found


def _remove_at(action: Callable[..., None], name: str, dir_fd: int, path: str) -> None:
    """``action(name, dir_fd=dir_fd)`` (rmdir or unlink, neither follows a link at ``name``);
    absent is fine; ``path`` names it in the error for a directory that is not empty."""
    try:
        action(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            raise OSError(exc.errno, f"failed to remove dir [{path}]: not empty") from exc
        raise


def secret_lookup_error(ref: SecretRef, namespace: str, exc: BaseException, what: str) -> str:
    """The kubelet's wording for a failed secret fetch."""
    return f"fetching {what} {ref.namespace or namespace}/{ref.name} failed: {exc}"

