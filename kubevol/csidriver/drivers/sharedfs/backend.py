"""The sharedfs driver's storage: sub-directories of network filesystems, staged the way
Azure Lustre's driver stages them.

- **Controller**: CreateVolume mounts the filesystem in a private directory under
  ``<state>/work`` for the call and makes the sub-directory there (an existing one is
  reused, as csi-driver-nfs does); DeleteVolume deletes, keeps or archives it
  (``archived-NAME``); the private mount is undone before the call returns.
- **Node**: NodeStage mounts the whole filesystem at the staging path (root ``/``), or,
  with ``share_client``, binds the root of another staging mount of the same filesystem
  this driver made (one client, one device number for all, as the kernel's NFS and Lustre
  clients share a superblock); NodePublish binds ``<staging>/<sub-dir>`` at the target;
  NodeUnpublish and NodeUnstage unmount, never delete data.

Whether a path shows the driver's mount is decided from the mount table (never blocks),
not by a ``stat`` below the mount. Every call below a mount of the network filesystem goes
through a :class:`~kubevol.mount.probe.PathProbe` with the configured deadline: a server
that does not answer makes the volume abnormal (NodeGetVolumeStats) or the call fail,
never hangs the driver.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from kubevol.csi import types as t
from kubevol.csidriver.drivers.engine.backend import Source, VolumeBackend
from kubevol.csidriver.drivers.engine.records import Publication, Staging, VolumeRecord
from kubevol.csidriver.drivers.engine.rpc import Code, fail
from kubevol.csidriver.drivers.engine.settings import READ_ONLY_MODES
from kubevol.csidriver.drivers.hostpath.backend import HEALTHY, bind_options, check_staging_dir
from kubevol.csidriver.drivers.sharedfs.config import SharedFSConfig
from kubevol.csidriver.drivers.sharedfs.location import (
    STATIC,
    Filesystem,
    LocationError,
    OnDelete,
    VolumeLocation,
    location_of,
)
from kubevol.errors import MetricsError, MountError
from kubevol.metrics import MetricsDu
from kubevol.mount import LinuxMounter
from kubevol.mount.mountinfo import MountInfo
from kubevol.mount.probe import PathProbe, UnresponsiveError
from kubevol.util.keyedlocks import KeyedLocks

T = TypeVar("T")

#: Unmounts tried on one path before giving up (mounts may be stacked there).
MAX_STACKED_MOUNTS = 8
#: Prefix of an archived sub-directory (csi-driver-nfs's).
ARCHIVE_PREFIX = "archived-"
#: How many times the probe's deadline a directory walk may take (du, recursive delete).
WALK_FACTOR = 6


class SharedFSBackend(VolumeBackend):
    """Sub-directories of network filesystems; see the module docstring."""

    def __init__(
        self,
        config: SharedFSConfig,
        mounter: LinuxMounter | None = None,
        probe: PathProbe | None = None,
    ) -> None:
        self.config = config
        self.default = config.default_filesystem()
        self.mounter = mounter or LinuxMounter()
        self.probe = probe or PathProbe(config.timeout)
        self.work_dir = os.path.join(config.state_dir, "work")
        os.makedirs(self.work_dir, mode=0o700, exist_ok=True)
        self._peers: Callable[[], list[VolumeRecord]] = list
        self._recorded: Callable[[str], bool] = lambda _id: False
        self._create_lock = threading.Lock()
        #: Staging of one filesystem is one at a time, so that volumes staged together
        #: share one client (the second binds the first) instead of mounting one each.
        self._stage_locks: KeyedLocks[Filesystem] = KeyedLocks()
        #: The staging paths this process mounted, with their filesystem: peers before the
        #: engine has recorded their staging.
        self._staged: dict[str, Filesystem] = {}
        #: Volume ids whose directory a CreateVolume in progress made (undone on failure).
        self._made: set[str] = set()

    def bind_state(
        self, volumes: Callable[[], list[VolumeRecord]], recorded: Callable[[str], bool]
    ) -> None:
        """Give the backend the engine's volumes (to find the staging mounts to share and
        the sub-directories in use) and whether a volume id has a record."""
        self._peers = volumes
        self._recorded = recorded

    # --- where things are -------------------------------------------------------------

    def location(self, volume: VolumeRecord) -> VolumeLocation:
        """The volume's filesystem and sub-directory, from its parameters; INTERNAL for a
        record whose parameters no longer parse (an edited state)."""
        try:
            return location_of(
                volume.parameters,
                name="" if volume.parameters.get(STATIC) == "true" else volume.name,
                default=self.default,
                on_delete=self.config.on_delete,
            )
        except LocationError as exc:
            fail(Code.INTERNAL, f"volume {volume.volume_id}: {exc}")

    def stage_filesystem(self, volume: VolumeRecord, capability: t.VolumeCapability) -> Filesystem:
        """The filesystem as staged for ``capability``: its mount flags added, ``ro`` for a
        read-only access mode."""
        access = capability.access_type
        flags = tuple(access.mount_flags) if isinstance(access, t.MountAccess) else ()
        if capability.access_mode in READ_ONLY_MODES:
            flags = (*flags, "ro")
        try:
            return self.location(volume).filesystem.with_options(flags)
        except LocationError as exc:
            fail(Code.INVALID_ARGUMENT, f"volume {volume.volume_id}: {exc}")

    def _below(self, mount_point: str, path: str, what: str, fn: Callable[[], T],
               factor: float = 1) -> T:
        """``fn()`` below ``mount_point`` with the deadline; UNAVAILABLE when it does not
        answer (the caller's volume is left as it is)."""
        try:
            return self.probe.call(mount_point, path, what, fn, self.probe.timeout * factor)
        except UnresponsiveError as exc:
            fail(Code.UNAVAILABLE, f"the filesystem does not answer: {exc}")

    # --- the controller's private mounts ----------------------------------------------

    @contextlib.contextmanager
    def mounted(self, filesystem: Filesystem) -> Iterator[str]:
        """The filesystem's root, mounted in a private directory for the block."""
        where = tempfile.mkdtemp(prefix="fs-", dir=self.work_dir)
        try:
            try:
                self.mounter.mount(filesystem.source, where, filesystem.fstype,
                                   filesystem.mount_options)
            except MountError as exc:
                fail(Code.UNAVAILABLE, f"cannot mount {filesystem.source}: {exc}")
            try:
                yield where
            finally:
                self._unmount_private(where)
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(where)

    def _unmount_private(self, where: str) -> None:
        for _ in range(MAX_STACKED_MOUNTS):
            if self.mounter.table().find_mount_point(where) is None:
                return
            try:
                self.mounter.unmount(where)
            except MountError:
                # A call still stuck below it keeps it busy: detach it lazily.
                subprocess.run(["umount", "-l", where], capture_output=True, check=False)

    # --- controller -----------------------------------------------------------------

    def create_volume(self, volume: VolumeRecord, source: Source) -> None:
        """Make the sub-directory (mode 0777, parents as needed); an existing directory is
        reused. ALREADY_EXISTS when another volume uses the same sub-directory."""
        if source is not None:
            fail(Code.INVALID_ARGUMENT, "sharedfs volumes cannot be filled from a source")
        loc = self.location(volume)
        with self._create_lock:
            for other in self._peers():
                if other.volume_id == volume.volume_id:
                    continue
                try:
                    theirs = self.location(other)
                except Exception:  # a broken record does not block others
                    continue
                if _same_place(theirs, loc):
                    fail(
                        Code.ALREADY_EXISTS,
                        f"sub-directory {loc.sub_dir or '/'} of {loc.filesystem.source} is "
                        f"volume {other.volume_id}'s",
                    )
            if not loc.sub_dir:
                return
            with self.mounted(loc.filesystem) as root:
                path = os.path.join(root, loc.sub_dir)
                if self._below(root, path, "mkdir", lambda: _make_dir(path)):
                    self._made.add(volume.volume_id)

    def delete_volume(self, volume: VolumeRecord) -> None:
        """Delete, keep or archive the sub-directory (``onDelete``). A static volume, the
        filesystem's root, or a sub-directory another volume also names is kept."""
        recorded = self._recorded(volume.volume_id)
        made = volume.volume_id in self._made
        self._made.discard(volume.volume_id)
        loc = self.location(volume)
        if not recorded:
            # Undoing a CreateVolume that failed: only a directory it made, if still empty.
            if made and loc.sub_dir:
                with self.mounted(loc.filesystem) as root:
                    path = os.path.join(root, loc.sub_dir)
                    self._below(root, path, "rmdir", lambda: _rmdir_quietly(path))
            return
        if loc.static or not loc.sub_dir or loc.on_delete is OnDelete.RETAIN:
            return
        if any(
            v.volume_id != volume.volume_id and _same_place(self.location(v), loc)
            for v in self._peers()
        ):
            return
        with self.mounted(loc.filesystem) as root:
            path = os.path.join(root, loc.sub_dir)
            if loc.on_delete is OnDelete.ARCHIVE:
                self._below(root, path, "rename", lambda: _archive(path))
            else:
                self._below(root, path, "delete", lambda: _remove_tree(path), WALK_FACTOR)

    def expand_volume(self, volume: VolumeRecord, new_size: int) -> bool:
        """Only the record grows: a sub-directory has no size of its own."""
        return False

    def create_snapshot(self, snapshot: object, volume: VolumeRecord) -> None:
        """Not offered (CREATE_DELETE_SNAPSHOT is not advertised)."""
        fail(Code.UNIMPLEMENTED, "sharedfs takes no snapshots")

    def delete_snapshot(self, snapshot: object) -> None:
        """Nothing to delete: there are no snapshots."""

    def volume_condition(self, volume: VolumeRecord) -> t.VolumeCondition:
        """Through the staging mount when the volume is staged here; else not looked at."""
        if volume.staging is not None:
            stats = self.volume_stats(volume, volume.staging.path)
            if stats.volume_condition is not None:
                return stats.volume_condition
        return HEALTHY

    def capacity(self, filesystem: Filesystem) -> int:
        """Bytes free on the filesystem (statfs through a private mount)."""
        with self.mounted(filesystem) as root:
            st = self._below(root, root, "statfs", lambda: os.statvfs(root))
        return st.f_bavail * st.f_frsize

    def health_problem(self) -> str | None:
        """The state directory must be writable (the network filesystem is not touched)."""
        if not os.access(self.work_dir, os.W_OK):
            return f"{self.work_dir} is not writable"
        return None

    # --- node -----------------------------------------------------------------------

    def _entry(self, path: str) -> MountInfo | None:
        return self.mounter.table().find_mount_point(path)

    def stage(self, volume: VolumeRecord, staging: Staging, *, repeat: bool) -> Staging:
        """Mount the filesystem (root ``/``) at the staging path, or bind the root of a
        staging mount of it this driver made. A mount already there is accepted only on a
        repeat, and only if it is this filesystem's root."""
        check_staging_dir(staging.path)
        filesystem = self.stage_filesystem(volume, staging.capability)
        with self._stage_locks.hold(filesystem):
            self._stage_locked(volume, staging, filesystem, repeat=repeat)
            self._staged[staging.path] = filesystem
        return staging

    def _stage_locked(
        self, volume: VolumeRecord, staging: Staging, filesystem: Filesystem, *, repeat: bool
    ) -> None:
        entry = self._entry(staging.path)
        if entry is not None:
            if repeat and _is_root_of(entry, filesystem, "/"):
                return
            fail(
                Code.FAILED_PRECONDITION,
                f"staging path {staging.path} is already a mount point this driver did not "
                "make; left alone",
            )
        peer = self._peer_staging(volume, filesystem) if self.config.share_client else None
        if peer is not None:
            readonly = "ro" in filesystem.mount_options
            self.mounter.mount(peer, staging.path, "", ["bind", *(["ro"] if readonly else [])])
            entry = self._entry(staging.path)
            if entry is not None and _is_root_of(entry, filesystem, "/"):
                return
            # The peer was unstaged meanwhile: what got bound is not the filesystem.
            self._unmount_own(staging.path, None)
        self.mounter.mount(
            filesystem.source, staging.path, filesystem.fstype, filesystem.mount_options
        )

    def _peer_staging(self, volume: VolumeRecord, filesystem: Filesystem) -> str | None:
        """A staging path of another volume where this very filesystem (same options) is
        mounted, root ``/``, or None."""
        candidates = [path for path, theirs in self._staged.items() if theirs == filesystem]
        for other in self._peers():
            if other.volume_id == volume.volume_id or other.staging is None:
                continue
            try:
                theirs = self.stage_filesystem(other, other.staging.capability)
            except Exception:  # a broken record is no peer
                continue
            if theirs == filesystem:
                candidates.append(other.staging.path)
        for path in candidates:
            entry = self._entry(path)
            if entry is not None and _is_root_of(entry, filesystem, "/"):
                return path
        return None

    def stage_leftover(self, volume: VolumeRecord, staging: Staging) -> bool:
        """The filesystem still mounted at the staging path."""
        entry = self._entry(staging.path)
        return entry is not None and self.location(volume).filesystem.shown_by(entry)

    def _unmount_own(self, path: str, filesystem: Filesystem | None, root: str = "/") -> None:
        """Unmount the driver's mounts at ``path`` (stacked ones too). A mount there that
        is not ``filesystem`` at ``root`` is someone else's: FAILED_PRECONDITION, left in
        place. ``filesystem`` None: whatever is there (a bind this call just made)."""
        for _ in range(MAX_STACKED_MOUNTS):
            entry = self._entry(path)
            if entry is None:
                return
            if filesystem is not None and not _is_root_of(entry, filesystem, root):
                fail(
                    Code.FAILED_PRECONDITION,
                    f"{path} has a mount this driver did not make ({entry.source} type "
                    f"{entry.fs_type}); left in place",
                )
            self.mounter.unmount(path)
        if self._entry(path) is not None:
            raise MountError(f"{path} is still mounted after {MAX_STACKED_MOUNTS} unmounts")

    def unstage(self, volume: VolumeRecord, staging: Staging) -> None:
        """Unmount the staging path (this filesystem's mounts only); data stays."""
        self._unmount_own(staging.path, self.location(volume).filesystem)
        self._staged.pop(staging.path, None)

    def publish(
        self,
        volume: VolumeRecord,
        publication: Publication,
        staging: Staging | None,
        *,
        repeat: bool,
    ) -> None:
        """Bind ``<staging>/<sub-dir>`` at the target (created here), read-only when asked."""
        if staging is None:
            fail(Code.FAILED_PRECONDITION, f"volume {volume.volume_id} must be staged first")
        loc = self.location(volume)
        entry = self._entry(staging.path)
        if entry is None or not loc.filesystem.shown_by(entry):
            fail(
                Code.FAILED_PRECONDITION,
                f"staging path {staging.path} is not mounted: stage the volume again",
            )
        source = os.path.join(staging.path, loc.sub_dir) if loc.sub_dir else staging.path
        if not self._below(staging.path, source, "stat", lambda: os.path.isdir(source)):
            fail(
                Code.NOT_FOUND,
                f"sub-directory {loc.sub_dir} is missing from {loc.filesystem.source}",
            )
        target = publication.target_path
        if not repeat and os.path.lexists(target):
            fail(
                Code.FAILED_PRECONDITION,
                f"target {target} already exists and this driver did not create it; "
                "left alone (the SP creates the target path)",
            )
        current = self._entry(target)
        if current is not None:
            if _is_root_of(current, loc.filesystem, loc.root):
                return
            fail(
                Code.FAILED_PRECONDITION,
                f"target {target} has a mount this driver did not make; left alone",
            )
        if os.path.lexists(target) and (os.path.islink(target) or not os.path.isdir(target)):
            fail(Code.FAILED_PRECONDITION, f"mount target {target} is not a directory")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(target, 0o750)
        try:
            self.mounter.mount(source, target, "", bind_options(publication, publication.readonly))
        except MountError:
            with contextlib.suppress(OSError):
                if self._entry(target) is None:
                    os.rmdir(target)
            raise

    def unpublish(self, volume: VolumeRecord, publication: Publication) -> None:
        """Unmount the driver's bind at the target and remove the (empty) target."""
        loc = self.location(volume)
        target = publication.target_path
        self._unmount_own(target, loc.filesystem, loc.root)
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                os.rmdir(target)
            else:
                os.unlink(target)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise MountError(f"cannot remove target {target}: {exc}") from exc

    def volume_stats(self, volume: VolumeRecord, path: str) -> t.VolumeStats:
        """Usage of the sub-directory (du) against the filesystem's size (statfs), each
        with the deadline. Abnormal when the path is not mounted any more, or the
        filesystem fails or does not answer in time; a du that takes longer than the
        statfs's deadline times :data:`WALK_FACTOR` leaves the bytes used unmeasured."""
        loc = self.location(volume)
        source = loc.filesystem.source
        entry = self._entry(path)
        if entry is None or not loc.filesystem.shown_by(entry):
            return _abnormal(f"{path} is no longer a mount of {source}")
        staged = volume.staging is not None and volume.staging.path == path
        directory = os.path.join(path, loc.sub_dir) if staged and loc.sub_dir else path
        try:
            st = self.probe.call(path, directory, "statfs", lambda: os.statvfs(directory))
        except UnresponsiveError as exc:
            return _abnormal(f"{source} ({loc.filesystem.fstype}) does not answer: {exc}")
        except OSError as exc:
            return _abnormal(f"{source} ({loc.filesystem.fstype}) fails: {exc.strerror} "
                             f"(errno {errno.errorcode.get(exc.errno or 0, exc.errno)})")
        total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        used, inodes_used, note = (total - st.f_bfree * st.f_frsize), st.f_files - st.f_ffree, ""
        try:
            metrics = self.probe.call(
                f"{path}#du", directory, "du", lambda: MetricsDu(directory).get_metrics(),
                self.probe.timeout * WALK_FACTOR,
            )
            used, inodes_used = metrics.used or 0, metrics.inodes_used or 0
        except (UnresponsiveError, MetricsError) as exc:
            note = f"; usage of {loc.sub_dir or '/'} not measured: {exc}"
        usage = (
            t.VolumeUsage(unit=t.UsageUnit.BYTES, total=total, used=used, available=free),
            t.VolumeUsage(unit=t.UsageUnit.INODES, total=st.f_files, used=inodes_used,
                          available=st.f_ffree),
        )
        condition = t.VolumeCondition(abnormal=False, message=HEALTHY.message + note)
        return t.VolumeStats(usage=usage, volume_condition=condition)

    def node_expand(self, volume: VolumeRecord, path: str) -> int:
        """Nothing to do on the node: the capacity is the record's."""
        return volume.capacity_bytes


def _abnormal(message: str) -> t.VolumeStats:
    """An abnormal condition with zero (unknown) usage figures: the kubelet drops a stats
    answer without usage ("usage is nil"), and the condition with it."""
    return t.VolumeStats(
        usage=(t.VolumeUsage(unit=t.UsageUnit.BYTES), t.VolumeUsage(unit=t.UsageUnit.INODES)),
        volume_condition=t.VolumeCondition(abnormal=True, message=message),
    )


def _same_place(a: VolumeLocation, b: VolumeLocation) -> bool:
    return (a.filesystem.source, a.filesystem.fstype, a.sub_dir) == (
        b.filesystem.source,
        b.filesystem.fstype,
        b.sub_dir,
    )


def _is_root_of(entry: MountInfo, filesystem: Filesystem, root: str) -> bool:
    """Whether ``entry`` shows ``filesystem`` at ``root`` (``/`` for a staging mount,
    ``/<sub-dir>`` for a publication)."""
    return filesystem.shown_by(entry) and os.path.normpath(entry.root) == os.path.normpath(root)


def _make_dir(path: str) -> bool:
    """Make ``path`` (parents too), mode 0777; whether it was made (False: reused)."""
    if os.path.isdir(path) and not os.path.islink(path):
        return False
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    os.chmod(path, 0o777)
    return True


def _rmdir_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_tree(path: str) -> None:
    """Delete the directory tree at ``path`` (links as links); missing is success."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
        return
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def _archive(path: str) -> None:
    """Rename ``path`` to ``archived-NAME`` beside it (``-<unix time>`` added when taken)."""
    if not os.path.lexists(path):
        return
    parent, name = os.path.split(path)
    dest = os.path.join(parent, ARCHIVE_PREFIX + name)
    if os.path.lexists(dest):
        dest = f"{dest}-{int(time.time())}"
    os.rename(path, dest)
