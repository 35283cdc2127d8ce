"""What is mounted at a pod volume's paths: a check against the live mounter, and one
against a snapshot of the mount table (what a whole scan uses: one moment, one reading)."""

from __future__ import annotations

import enum
import functools
import os

from kubevol import layout
from kubevol.mount.helpers import is_corrupted_error
from kubevol.mount.interface import MountInterface
from kubevol.mount.probe import PathProbe, UnresponsiveError, is_suspect
from kubevol.mount.table import MountTable


class MountCheck(enum.StrEnum):
    """What was found at a volume's mount path (or device link, for block volumes)."""

    MOUNTED = "mounted"
    NOT_MOUNTED = "not-mounted"
    CORRUPTED = "corrupted"
    MISSING = "missing"
    #: The plugin keeps nothing at a pod path (hostPath).
    NONE = "none"
    #: A network or FUSE mount that did not answer within its deadline (a dead server, a
    #: frozen daemon): still mounted, nothing is done to it.
    UNRESPONSIVE = "unresponsive"


#: What counts as a mount still there: may not be removed, may be unmounted.
STILL_MOUNTED = (MountCheck.MOUNTED, MountCheck.CORRUPTED, MountCheck.UNRESPONSIVE)


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
    checked paths are under, translated to its real path once.

    A path that is the mount point of a network or FUSE filesystem is looked at through
    ``probe`` (:mod:`kubevol.mount.probe`): when it does not answer in time it is
    UNRESPONSIVE."""

    def __init__(self, table: MountTable, root_dir: str, probe: PathProbe | None = None) -> None:
        self.points = {e.mount_point: e.fs_type for e in table.entries()}
        self._root = os.path.abspath(root_dir)
        self._real_root = os.path.realpath(root_dir)
        self.probe = probe if probe is not None else PathProbe()
        # The suspect mount points under the root are asked all at once, now: a dead
        # server's volumes cost one deadline together, not one each, as the scan goes.
        suspects = [p for p, fs_type in self.points.items()
                    if is_suspect(fs_type) and layout.is_within(p, self._real_root)]
        answers = self.probe.call_each([
            (p, p, "stat", functools.partial(stat_problem, p)) for p in suspects])
        self._answers: dict[str, MountCheck | BaseException | None] = dict(
            zip(suspects, answers, strict=True))

    def real(self, path: str) -> str:
        """``path`` with symbolic links resolved (cheaply for paths under the root)."""
        return layout.real_below(path, self._root, self._real_root)

    def check(self, path: str) -> MountCheck:
        """:func:`check_mount` by the snapshot."""
        if not path:
            return MountCheck.NONE
        real = self.real(path)
        fs_type = self.points.get(real)
        try:
            if real in self._answers:
                answer = self._answers[real]
                if isinstance(answer, BaseException):
                    raise answer
                problem = answer
            elif fs_type is not None and is_suspect(fs_type):
                problem = self.probe.call(real, path, "stat", lambda: stat_problem(path))
            else:
                problem = stat_problem(path)
        except UnresponsiveError:
            return MountCheck.UNRESPONSIVE
        if problem is not None:
            return problem
        return MountCheck.MOUNTED if fs_type is not None else MountCheck.NOT_MOUNTED


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
