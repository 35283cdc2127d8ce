"""The mount layer (Kubernetes' ``k8s.io/mount-utils``): the mount table, a real Linux
mounter, corrupted-mount checks, safe cleanup and formatting, mount references and the
unstage guard."""

from kubevol.mount.blockmap import map_block_device, unmap_block_device
from kubevol.mount.format import SafeFormatAndMount
from kubevol.mount.guard import (
    GuardPolicy,
    MountRef,
    RefKind,
    UnmountGuard,
    UnmountVerdict,
    check_unmount_device,
    kubelet_refs_verdict,
)
from kubevol.mount.helpers import (
    CORRUPTED_MOUNT_ERRNOS,
    cleanup_mount_point,
    get_mount_refs,
    is_corrupted_error,
    is_corrupted_mount,
    path_exists,
    remove_tree_on_one_device,
    search_mount_points,
)
from kubevol.mount.interface import MountInterface, MountPoint
from kubevol.mount.linux import LinuxMounter
from kubevol.mount.mountinfo import (
    MountInfo,
    parse_mountinfo,
    parse_mountinfo_bytes,
    parse_mountinfo_line,
    parse_mountinfo_text,
)
from kubevol.mount.mountread import PROC_MOUNTINFO, read_mountinfo_bytes
from kubevol.mount.table import MountTable, MountTableCache

__all__ = [
    "CORRUPTED_MOUNT_ERRNOS",
    "PROC_MOUNTINFO",
    "GuardPolicy",
    "LinuxMounter",
    "MountInfo",
    "MountInterface",
    "MountPoint",
    "MountRef",
    "MountTable",
    "MountTableCache",
    "RefKind",
    "SafeFormatAndMount",
    "UnmountGuard",
    "UnmountVerdict",
    "check_unmount_device",
    "cleanup_mount_point",
    "get_mount_refs",
    "is_corrupted_error",
    "is_corrupted_mount",
    "kubelet_refs_verdict",
    "map_block_device",
    "parse_mountinfo",
    "parse_mountinfo_bytes",
    "parse_mountinfo_line",
    "parse_mountinfo_text",
    "path_exists",
    "read_mountinfo_bytes",
    "remove_tree_on_one_device",
    "search_mount_points",
    "unmap_block_device",
]
