"""The hostpath driver's storage: directories and loop-backed image files under a state
directory, staged and published with real bind mounts.

Layout under ``root``::

    volumes/<id>/        a mount volume          snapshots/<id>/      its snapshot
    volumes/<id>.img     a block volume (sparse) snapshots/<id>.img   its snapshot

Staging a mount volume bind-mounts its directory at the staging path; staging a block
volume attaches its image to a loop device. Publishing bind-mounts the staging path (mount
access) or the loop device node (block access, onto a file) at the target, then remounts
read-only when asked. Every step checks the mount table first, so repeating it after a crash
or a restart neither stacks mounts nor fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess

from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.engine.backend import Source, VolumeBackend
from kubevol.csidriver.drivers.engine.records import (
    AccessKind,
    Publication,
    SnapshotRecord,
    Staging,
    VolumeRecord,
)
from kubevol.csidriver.drivers.engine.rpc import Code, fail
from kubevol.csidriver.drivers.hostpath import loop
from kubevol.errors import MetricsError, MountError
from kubevol.metrics import MetricsBlock, MetricsDu
from kubevol.mount import LinuxMounter, cleanup_mount_point, is_corrupted_mount
from kubevol.mount.table import MountTable

#: Unmounts tried on one target before giving up (mounts may be stacked there).
MAX_STACKED_MOUNTS = 8


def mounted(mounter: LinuxMounter, path: str) -> bool:
    """Whether ``path`` is a mount point (a corrupted mount counts as mounted)."""
    if is_corrupted_mount(path):
        return True
    return os.path.lexists(path) and mounter.is_mount_point(path)


def unmount_all(mounter: LinuxMounter, path: str) -> None:
    """Unmount ``path`` until it is no longer a mount point (stacked mounts included).
    Only for mounts the driver made privately (its controller's work mounts)."""
    for _ in range(MAX_STACKED_MOUNTS):
        if not mounted(mounter, path):
            return
        mounter.unmount(path)
    if mounted(mounter, path):
        raise MountError(f"{path} is still mounted after {MAX_STACKED_MOUNTS} unmounts")


def shows(path: str, source: str) -> bool:
    """Whether ``path`` shows the same file as ``source`` (same device and inode): a bind of
    ``source`` (or of a bind of it) is mounted there. False when either cannot be read."""
    try:
        a, b = os.stat(path), os.stat(source)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def unmount_own(mounter: LinuxMounter, path: str, source: str) -> None:
    """Unmount the driver's own binds of ``source`` at ``path`` (repeated binds included).

    A mount at ``path`` that does not show ``source`` was made by someone else (mounted
    over the driver's): it is left alone and the call fails with FAILED_PRECONDITION. A
    corrupted mount cannot be compared and is unmounted: the state says the path is ours.
    """
    for _ in range(MAX_STACKED_MOUNTS):
        if not mounted(mounter, path):
            return
        if not is_corrupted_mount(path) and not shows(path, source):
            fail(
                Code.FAILED_PRECONDITION,
                f"{path} has a mount this driver did not make (it does not show {source}); "
                "left in place",
            )
        mounter.unmount(path)
    if mounted(mounter, path):
        raise MountError(f"{path} is still mounted after {MAX_STACKED_MOUNTS} unmounts")


def remove_target(mounter: LinuxMounter, path: str, source: str) -> None:
    """Unmount the driver's binds of ``source`` at ``path`` and remove it (an empty
    directory or a file). Never recursive: a directory that is not empty after unmounting
    stays and the call raises."""
    unmount_own(mounter, path, source)
    if os.path.isdir(path) and not os.path.islink(path):
        cleanup_mount_point(path, mounter, extensive_check=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def bind_options(publication_or_staging: Publication | Staging, readonly: bool) -> list[str]:
    """``bind`` plus the capability's mount flags, plus ``ro`` when read-only."""
    access = publication_or_staging.capability.access_type
    flags = list(access.mount_flags) if isinstance(access, t.MountAccess) else []
    return ["bind", *flags, *(["ro"] if readonly else [])]


def copy_tree(source: str, dest: str) -> None:
    """Copy a directory tree (links as links, owners and modes kept) into new ``dest``."""
    shutil.copytree(source, dest, symlinks=True, copy_function=shutil.copy2)
    shutil.copystat(source, dest)


def copy_sparse(source: str, dest: str) -> None:
    """Copy an image file keeping its holes (``cp --sparse=always``)."""
    result = subprocess.run(
        ["cp", "--sparse=always", source, dest], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise OSError(f"cp {source} {dest} failed: {result.stderr.strip()}")


def remove_tree(path: str, table: MountTable) -> None:
    """Delete a volume's or snapshot's directory, refusing when ``table`` (the mount table
    as it is now) has a mount inside it (deleting through a mount point would destroy
    someone else's data)."""
    inside = [e.mount_point for e in table.mounted_under(os.path.realpath(path))]
    if inside:
        fail(Code.FAILED_PRECONDITION, f"cannot delete {path}: mounts inside it: {inside}")
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def mount_usage(path: str, capacity: int) -> tuple[t.VolumeUsage, ...]:
    """Bytes and inodes of the directory tree at ``path`` against ``capacity`` bytes."""
    metrics = MetricsDu(path).get_metrics()
    used = metrics.used or 0
    available = max(0, min(capacity - used, metrics.available or 0))
    return (
        t.VolumeUsage(unit=t.UsageUnit.BYTES, total=capacity, used=used, available=available),
        t.VolumeUsage(
            unit=t.UsageUnit.INODES,
            total=metrics.inodes or 0,
            used=metrics.inodes_used or 0,
            available=metrics.inodes_free or 0,
        ),
    )


def path_condition(mounter: LinuxMounter, path: str) -> t.VolumeCondition | None:
    """Abnormal when ``path`` (where the volume should be mounted) is gone, corrupted or no
    longer a mount point; None when it looks right."""
    if is_corrupted_mount(path):
        return t.VolumeCondition(abnormal=True, message=f"the mount at {path} is corrupted")
    if not os.path.lexists(path):
        return t.VolumeCondition(abnormal=True, message=f"{path} does not exist any more")
    if not mounter.is_mount_point(path):
        return t.VolumeCondition(abnormal=True, message=f"{path} is no longer mounted")
    return None


HEALTHY = t.VolumeCondition(abnormal=False, message="volume is healthy")


def bound_device(target: str, table: MountTable) -> str:
    """The device node bind-mounted at ``target`` (``/dev/loopN``), or "" when the mount
    there (in ``table``) is not a bind of a node of the ``/dev`` filesystem."""
    entry = table.find_mount_point(target)
    if entry is None or entry.fs_type != "devtmpfs":
        return ""
    return "/dev" + entry.root


#: What a volume or snapshot id must look like to name a file under the state directory
#: (ids are uuids this driver made; anything else came from an edited state file).
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def storage_name(record_id: str, what: str) -> str:
    """``record_id`` when it is safe as a file name under the state directory; INTERNAL for
    anything else (``..``, ``/``, a leading dot), so that a state file edited to name a
    path outside the state directory makes the driver refuse, not delete it."""
    if not _SAFE_ID.fullmatch(record_id):
        fail(
            Code.INTERNAL,
            f"the driver state names {what} {record_id!r}, which is not an id this driver "
            "makes; refusing to touch storage for it",
        )
    return record_id


def check_staging_dir(path: str) -> None:
    """FAILED_PRECONDITION unless ``path`` is a real directory (the CO creates it) that is
    not the root and not a symbolic link (a link would take the mount elsewhere)."""
    if os.path.islink(path) or os.path.realpath(path) == "/":
        fail(Code.FAILED_PRECONDITION, f"staging path {path} is a link or the root directory")
    if not os.path.isdir(path):
        fail(
            Code.FAILED_PRECONDITION,
            f"staging path {path} is not a directory (the CO creates it)",
        )


class HostPathBackend(VolumeBackend):
    """Directories and loop-backed images under ``root``; see the module docstring.

    It acts only on mounts its state says it made: a staging path that is already a mount
    point, or a target that already exists, is refused unless the engine's record of the
    staging or publication existed before the call (a repeat, or a retry after a crash).
    """

    def __init__(self, root: str, mounter: LinuxMounter | None = None) -> None:
        self.root = root
        self.mounter = mounter or LinuxMounter()
        self.volumes_dir = os.path.join(root, "volumes")
        self.snapshots_dir = os.path.join(root, "snapshots")
        for directory in (self.volumes_dir, self.snapshots_dir):
            os.makedirs(directory, mode=0o700, exist_ok=True)

    # --- where things are -------------------------------------------------------------

    def volume_path(self, vol: VolumeRecord) -> str:
        """The volume's directory or image file."""
        suffix = ".img" if vol.kind is AccessKind.BLOCK else ""
        return os.path.join(self.volumes_dir, storage_name(vol.volume_id, "volume") + suffix)

    def snapshot_path(self, snap: SnapshotRecord) -> str:
        """The snapshot's directory or image file."""
        suffix = ".img" if snap.kind is AccessKind.BLOCK else ""
        name = storage_name(snap.snapshot_id, "snapshot")
        return os.path.join(self.snapshots_dir, name + suffix)

    def _source_path(self, source: Source) -> str | None:
        if isinstance(source, SnapshotRecord):
            return self.snapshot_path(source)
        if isinstance(source, VolumeRecord):
            return self.volume_path(source)
        return None

    # --- controller -----------------------------------------------------------------

    def create_volume(self, volume: VolumeRecord, source: Source) -> None:
        """Make the directory (mode 0777, like a hostPath volume) or the sparse image,
        filled from ``source``, under a temporary name renamed into place when complete."""
        path = self.volume_path(volume)
        if os.path.lexists(path):
            return
        src = self._source_path(source)
        if src is not None and not os.path.exists(src):
            fail(Code.NOT_FOUND, f"the storage of the source ({src}) is missing")
        tmp = os.path.join(self.volumes_dir, f".{volume.volume_id}.partial")
        self._remove(tmp)
        try:
            if volume.kind is AccessKind.BLOCK:
                if src is not None:
                    copy_sparse(src, tmp)
                with open(tmp, "ab") as f:
                    f.truncate(max(volume.capacity_bytes, os.fstat(f.fileno()).st_size))
            elif src is not None:
                copy_tree(src, tmp)
            else:
                os.mkdir(tmp)
                os.chmod(tmp, 0o777)
            os.rename(tmp, path)
        except BaseException:
            self._remove(tmp)
            raise

    def _remove(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path, self.mounter.table())
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def delete_volume(self, volume: VolumeRecord) -> None:
        """Remove the directory or image; FAILED_PRECONDITION when a mount lies inside the
        directory or a loop device still uses the image."""
        path = self.volume_path(volume)
        if volume.kind is AccessKind.BLOCK and os.path.exists(path):
            devices = loop.devices_for(path)
            if devices:
                fail(Code.FAILED_PRECONDITION, f"image {path} is still attached to {devices}")
        self._remove(path)

    def expand_volume(self, volume: VolumeRecord, new_size: int) -> bool:
        """Grow a block volume's image (the node must refresh its loop device); a directory
        has nothing to grow."""
        if volume.kind is not AccessKind.BLOCK:
            return False
        with open(self.volume_path(volume), "r+b") as f:
            f.truncate(new_size)
        return True

    def create_snapshot(self, snapshot: SnapshotRecord, volume: VolumeRecord) -> None:
        """Copy the volume's directory or image to the snapshot's place."""
        dest = self.snapshot_path(snapshot)
        if os.path.lexists(dest):
            return
        src = self.volume_path(volume)
        if not os.path.exists(src):
            fail(Code.FAILED_PRECONDITION, f"the storage of volume {volume.volume_id} is missing")
        tmp = os.path.join(self.snapshots_dir, f".{snapshot.snapshot_id}.partial")
        self._remove(tmp)
        try:
            if snapshot.kind is AccessKind.BLOCK:
                copy_sparse(src, tmp)
            else:
                copy_tree(src, tmp)
            os.rename(tmp, dest)
        except BaseException:
            self._remove(tmp)
            raise

    def delete_snapshot(self, snapshot: SnapshotRecord) -> None:
        """Remove the snapshot's copy."""
        self._remove(self.snapshot_path(snapshot))

    def volume_condition(self, volume: VolumeRecord) -> t.VolumeCondition:
        """Abnormal when the volume's directory or image is gone."""
        path = self.volume_path(volume)
        if not os.path.exists(path):
            return t.VolumeCondition(abnormal=True, message=f"{path} is missing")
        return HEALTHY

    def health_problem(self) -> str | None:
        """The state directory must be writable."""
        if not os.access(self.volumes_dir, os.W_OK):
            return f"{self.volumes_dir} is not writable"
        return None

    # --- node -----------------------------------------------------------------------

    def stage(self, volume: VolumeRecord, staging: Staging, *, repeat: bool) -> Staging:
        """Bind the directory at the staging path, or attach the image to a loop device.
        A staging path that is already a mount point is refused unless this is a repeat
        and the mount there is the driver's own bind of the volume."""
        check_staging_dir(staging.path)
        source = self.volume_path(volume)
        if not os.path.exists(source):
            fail(Code.FAILED_PRECONDITION, f"the storage of volume {volume.volume_id} is missing")
        if volume.kind is AccessKind.BLOCK:
            writable = [d for d in loop.devices_for(source) if not loop.is_read_only(d)]
            if staging.device in writable:
                return staging
            # A writable device nobody recorded is the one an interrupted stage attached.
            device = writable[0] if writable else loop.attach(source)
            return Staging(path=staging.path, capability=staging.capability, device=device)
        if mounted(self.mounter, staging.path):
            if repeat and shows(staging.path, source):
                return staging
            fail(
                Code.FAILED_PRECONDITION,
                f"staging path {staging.path} is already a mount point this driver did not "
                "make; left alone",
            )
        self.mounter.mount(source, staging.path, "", bind_options(staging, False))
        return staging

    def stage_leftover(self, volume: VolumeRecord, staging: Staging) -> bool:
        """A bind of the volume still at the staging path."""
        if volume.kind is AccessKind.BLOCK:
            return False
        return mounted(self.mounter, staging.path) and shows(staging.path, self.volume_path(volume))

    def unstage(self, volume: VolumeRecord, staging: Staging) -> None:
        """Unmount the staging path (the driver's own bind only), or detach the loop
        device."""
        if volume.kind is AccessKind.BLOCK:
            image = self.volume_path(volume)
            if os.path.exists(image) and staging.device in loop.devices_for(image):
                loop.detach(staging.device)
            return
        unmount_own(self.mounter, staging.path, self.volume_path(volume))

    def _publish_source(self, volume: VolumeRecord, staging: Staging | None) -> str:
        if staging is None:
            fail(Code.FAILED_PRECONDITION, f"volume {volume.volume_id} must be staged first")
        if volume.kind is AccessKind.BLOCK:
            return staging.device
        if not mounted(self.mounter, staging.path):
            fail(
                Code.FAILED_PRECONDITION,
                f"staging path {staging.path} is not mounted: stage the volume again",
            )
        return staging.path

    def publish(
        self,
        volume: VolumeRecord,
        publication: Publication,
        staging: Staging | None,
        *,
        repeat: bool,
    ) -> None:
        """Bind the staging path (mount) or the loop device (block, onto a file) at the
        target, read-only when asked.

        A read-only mount of a device node does not stop writes to the device, so a
        read-only block publication gets its own read-only loop device over the image.
        """
        source = self._publish_source(volume, staging)
        if volume.kind is AccessKind.BLOCK and publication.readonly:
            own = self._own_device(volume, publication)
            if repeat and own:
                self.bind_at_target(own, publication, volume.kind, repeat=True)
                return
            self._check_fresh_target(publication, repeat)
            device = loop.attach(self.volume_path(volume), read_only=True)
            try:
                self.bind_at_target(device, publication, volume.kind, repeat=repeat)
            except BaseException:
                loop.detach(device)
                raise
            return
        self.bind_at_target(source, publication, volume.kind, repeat=repeat)

    @staticmethod
    def _check_fresh_target(publication: Publication, repeat: bool) -> None:
        target = publication.target_path
        if not repeat and os.path.lexists(target):
            fail(
                Code.FAILED_PRECONDITION,
                f"target {target} already exists and this driver did not create it; "
                "left alone (the SP creates the target path)",
            )

    def bind_at_target(
        self, source: str, publication: Publication, kind: AccessKind, *, repeat: bool
    ) -> None:
        """Create the target (directory or file) and bind ``source`` there. An existing
        target is the driver's own only on a ``repeat``; otherwise it is refused."""
        target = publication.target_path
        self._check_fresh_target(publication, repeat)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if mounted(self.mounter, target):
            if shows(target, source):
                return
            fail(
                Code.FAILED_PRECONDITION,
                f"target {target} has a mount this driver did not make; left alone",
            )
        if kind is AccessKind.BLOCK:
            if os.path.isdir(target) or os.path.islink(target):
                fail(Code.FAILED_PRECONDITION, f"block target {target} is not a file")
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        else:
            if os.path.lexists(target) and (os.path.islink(target) or not os.path.isdir(target)):
                fail(Code.FAILED_PRECONDITION, f"mount target {target} is not a directory")
            with contextlib.suppress(FileExistsError):
                os.mkdir(target, 0o750)
        try:
            self.mounter.mount(source, target, "", bind_options(publication, publication.readonly))
        except MountError:
            with contextlib.suppress(OSError, CSIRPCError):
                remove_target(self.mounter, target, source)
            raise

    def _own_device(self, volume: VolumeRecord, publication: Publication) -> str:
        """The read-only loop device of the volume's image bound at a read-only block
        publication's target, or ""."""
        device = bound_device(publication.target_path, self.mounter.table())
        image = self.volume_path(volume)
        if not device or not os.path.exists(image) or device not in loop.devices_for(image):
            return ""
        return device if loop.is_read_only(device) else ""

    def _target_source(self, volume: VolumeRecord, publication: Publication) -> str:
        """What the driver bound at a publication's target."""
        if volume.kind is AccessKind.BLOCK:
            if publication.readonly:
                return self._own_device(volume, publication) or publication.target_path
            return volume.staging.device if volume.staging else publication.target_path
        if volume.staging is not None:
            return volume.staging.path
        return self.volume_path(volume)

    def unpublish(self, volume: VolumeRecord, publication: Publication) -> None:
        """Unmount the driver's bind at the target and remove the target; detach a
        read-only block publication's own loop device."""
        own_device = ""
        if volume.kind is AccessKind.BLOCK and publication.readonly:
            own_device = self._own_device(volume, publication)
        source = self._target_source(volume, publication)
        remove_target(self.mounter, publication.target_path, source)
        if own_device:
            loop.detach(own_device)

    def volume_stats(self, volume: VolumeRecord, path: str) -> t.VolumeStats:
        """Usage through :mod:`kubevol.metrics` (du for directories, the device size for
        block), with a condition that is abnormal when the mount or the storage is gone."""
        block_staging = (
            volume.kind is AccessKind.BLOCK
            and volume.staging is not None
            and volume.staging.path == path
        )
        condition = None if block_staging else path_condition(self.mounter, path)
        if is_corrupted_mount(path) or not os.path.lexists(path):
            # The path itself is gone or broken: there is nothing to measure.
            return t.VolumeStats(volume_condition=condition)
        usage = self.measure(volume, path)
        if condition is None:
            storage = self.volume_condition(volume)
            condition = storage if storage.abnormal else HEALTHY
        return t.VolumeStats(usage=usage, volume_condition=condition)

    def measure(self, volume: VolumeRecord, path: str) -> tuple[t.VolumeUsage, ...]:
        """Usage of the volume at ``path``. Block: the device's size (staging paths of
        block volumes hold no device, so the volume's capacity is reported there)."""
        try:
            if volume.kind is AccessKind.BLOCK:
                if volume.staging is not None and path == volume.staging.path:
                    total = volume.capacity_bytes
                else:
                    total = MetricsBlock(path).get_metrics().capacity or 0
                return (t.VolumeUsage(unit=t.UsageUnit.BYTES, total=total),)
            return mount_usage(path, volume.capacity_bytes)
        except MetricsError as exc:
            if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.ENOENT:
                fail(Code.NOT_FOUND, f"{path} does not exist")
            raise

    def node_expand(self, volume: VolumeRecord, path: str) -> int:
        """Refresh the loop device's size (block) and report the capacity."""
        if volume.kind is AccessKind.BLOCK and volume.staging and volume.staging.device:
            for device in loop.devices_for(self.volume_path(volume)):
                loop.refresh_size(device)
            return loop.device_size(volume.staging.device)
        return volume.capacity_bytes
