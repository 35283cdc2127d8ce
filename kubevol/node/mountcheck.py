"""What is mounted at a pod volume's paths: a check against the live mounter, and one
against a snapshot of the mount table (what a whole scan uses: one moment, one reading)."""

from __future__ import annotations

import enum
import os

from kubevol import layout
from kubevol.mount.helpers import is_corrupted_error
from kubevol.mount.interface import MountInterface
from kubevol.mount.table import MountTable


class MountCheck(enum.StrEnum):
    """What was found at a volume's mount path (or device link, for block volumes)."""

    MOUNTED = "mounted"
    NOT_MOUNTED = "not-mounted"
    CORRUPTED = "corrupted"
    MISSING = "missing"
    #: The plugin keeps nothing at a pod path (hostPath).
    NONE = "none"


def check_mount(mounter: MountInterface, path: str) -> MountCheck:
    """Whether ``path`` is a mount point, a plain directory, a dead mount or missing."""
    if not path:
        return MountCheck.NONE
    try:
        # stat first: the mount check may answer from cached attributes of a dead mount.
        os.stat(path)
        not_mount = mounter.is_likely_not_mount_point(path)
    except FileNotFoundError:
        return MountCheck.MISSING
    except OSError as exc:
        if is_corrupted_error(exc):
            return MountCheck.CORRUPTED
        raise
    return MountCheck.NOT_MOUNTED if not_mount else MountCheck.MOUNTED


def check_link(path: str) -> MountCheck:
    """For a block volume's device link: MOUNTED when it leads to a device, else why not."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return MountCheck.MISSING
    # A dangling link: the device is gone.
    return stat_problem(path, missing=MountCheck.NOT_MOUNTED) or MountCheck.MOUNTED


def stat_problem(path: str, *, missing: MountCheck = MountCheck.MISSING) -> MountCheck | None:
    """None when ``path`` can be stat-ed; ``missing`` when it does not exist, CORRUPTED when
    it is a dead mount. Other errors are raised."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return missing
    except OSError as exc:
        if is_corrupted_error(exc):
            return MountCheck.CORRUPTED
        raise
    return None


class MountSnapshot:
    """Mount checks against one reading of the mount table (a whole scan sees one moment,
    and a set lookup is cheaper than a ``statx`` per path). ``root_dir`` is the root the
    checked paths are under, translated to its real path once."""

    def __init__(self, table: MountTable, root_dir: str) -> None:
        self.points = {e.mount_point for e in table.entries()}
        self._root = os.path.abspath(root_dir)
        self._real_root = os.path.realpath(root_dir)

    def real(self, path: str) -> str:
        """``path`` with symbolic links resolved (cheaply for paths under the root)."""
        if layout.is_within(path, self._root):
            return self._real_root + path[len(self._root):]
        return os.path.realpath(path)

    def check(self, path: str) -> MountCheck:
        """:func:`check_mount` by the snapshot."""
        if not path:
            return MountCheck.NONE
        problem = stat_problem(path)
        if problem is not None:
            return problem
        return MountCheck.MOUNTED if self.real(path) in self.points else MountCheck.NOT_MOUNTED


def pod_mounts(root_dir: str, pod_uid: str, table: MountTable) -> list[str]:
    """The mount points under ``root_dir`` that belong to pod ``pod_uid`` in ``table``:
    under its pod directory (volumes, subPaths), its CSI block publish path, and its bind
    under a block volume's global map path (``.../volumeDevices/<spec>/dev/<uid>``). What
    must be gone before anyone may say the pod is."""
    return mounts_by_pod(root_dir, table).get(pod_uid, [])


def mounts_by_pod(root_dir: str, table: MountTable) -> dict[str, list[str]]:
    """:func:`pod_mounts` of every pod at once, by pod UID: one pass over ``table``
    (asking pod by pod costs pods times mounts)."""
    base = os.path.realpath(root_dir)
    found: dict[str, list[str]] = {}
    for entry in table.entries():
        rel = layout.relative_to(entry.mount_point, base)
        if not rel:
            continue
        segments = rel.split("/")
        described = layout.describe(rel)
        owners: set[str] = set()
        if described is not None and described.pod_uid:
            owners.add(described.pod_uid)
        if (
            len(segments) >= 4
            and segments[-2] == layout.CSI_BLOCK_DEV
            and layout.VOLUME_DEVICES_DIR in segments
        ):
            owners.add(segments[-1])
        for uid in sorted(owners):
            found.setdefault(uid, []).append(entry.mount_point)
    return found
