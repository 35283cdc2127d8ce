"""The node volume manager: operation executor, desired and actual state, reconciler,
reconstruction from disk, and disk-based usage tracking (the kubelet's volume manager)."""

from kubevol.node.desired import NewPod, desired_pod, new_pods, volume_to_mount
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
from kubevol.node.manifests import Manifests, load_manifest_files, manifest_pod_uid, parse_manifests
from kubevol.node.mountcheck import MountCheck
from kubevol.node.operations import OperationGenerator, operation_key
from kubevol.node.orphans import OrphanDeviceMount
from kubevol.node.owners import Ownership, Verdict
from kubevol.node.poddirs import PodVolumeDir, list_pod_volume_dirs
from kubevol.node.reconciler import Reconciler
from kubevol.node.reconstruct import (
    FailedVolume,
    FoundVolume,
    Reconstruction,
    ScanPass,
    reconstruct_pod_volume,
    scan,
)
from kubevol.node.records import PodRecord, PodRecords, PodState
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
    "NewPod",
    "NodeVolumeManager",
    "OperationBackoffError",
    "OperationExecutor",
    "OperationFailure",
    "OperationGenerator",
    "OperationKey",
    "OperationKind",
    "OperationPendingError",
    "OrphanDeviceMount",
    "Ownership",
    "PodRecord",
    "PodRecords",
    "PodState",
    "PodVolumeDir",
    "PrivilegeError",
    "Reconciler",
    "Reconstruction",
    "ReconstructionError",
    "ScanPass",
    "SyncResult",
    "Verdict",
    "VolumeInUseError",
    "VolumeMode",
    "VolumeToMount",
    "VolumeUsage",
    "desired_pod",
    "list_pod_volume_dirs",
    "load_manifest_files",
    "manifest_pod_uid",
    "new_pods",
    "operation_key",
    "parse_manifests",
    "reconstruct_pod_volume",
    "scan",
    "volume_to_mount",
]
