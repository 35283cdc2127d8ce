"""The node volume manager: operation executor, desired and actual state, reconciler,
reconstruction from disk, and disk-based usage tracking (the kubelet's volume manager)."""

from kubevol.node.errors import (
    OperationBackoffError,
    OperationPendingError,
    PrivilegeError,
    ReconstructionError,
    VolumeInUseError,
)
from kubevol.node.executor import (
    OperationExecutor,
    OperationFailure,
    OperationKey,
    OperationKind,
)
from kubevol.node.manager import NodeVolumeManager, SyncResult
from kubevol.node.operations import OperationGenerator, operation_key
from kubevol.node.pods import (
    Manifests,
    PodRecord,
    PodRecords,
    PodState,
    desired_pod,
    load_manifest_files,
    parse_manifests,
    pod_uid,
    volume_to_mount,
)
from kubevol.node.reconciler import Reconciler
from kubevol.node.reconstruct import (
    FailedVolume,
    FoundVolume,
    MountCheck,
    OrphanDeviceMount,
    PodVolumeDir,
    Reconstruction,
    list_pod_volume_dirs,
    reconstruct_pod_volume,
    scan,
)
from kubevol.node.state import (
    ActualState,
    AttachedVolume,
    DesiredPod,
    DesiredState,
    MountedVolume,
    MountState,
    VolumeMode,
    VolumeToMount,
)
from kubevol.node.usage import VolumeUsage

__all__ = [
    "ActualState",
    "AttachedVolume",
    "DesiredPod",
    "DesiredState",
    "FailedVolume",
    "FoundVolume",
    "Manifests",
    "MountCheck",
    "MountState",
    "MountedVolume",
    "NodeVolumeManager",
    "OperationBackoffError",
    "OperationExecutor",
    "OperationFailure",
    "OperationGenerator",
    "OperationKey",
    "OperationKind",
    "OperationPendingError",
    "OrphanDeviceMount",
    "PodRecord",
    "PodRecords",
    "PodState",
    "PodVolumeDir",
    "PrivilegeError",
    "Reconciler",
    "Reconstruction",
    "ReconstructionError",
    "SyncResult",
    "VolumeInUseError",
    "VolumeMode",
    "VolumeToMount",
    "VolumeUsage",
    "desired_pod",
    "list_pod_volume_dirs",
    "load_manifest_files",
    "operation_key",
    "parse_manifests",
    "pod_uid",
    "reconstruct_pod_volume",
    "scan",
    "volume_to_mount",
]
