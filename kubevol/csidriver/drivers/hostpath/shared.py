"""``--shared-filesystem``: every volume is a sub-directory of ONE ext4 filesystem on ONE
loop device, the shape of Lustre (or CephFS, NFS) on a node.

Staging mounts that device at the volume's staging path, so every staging mount shows the
same major:minor with root ``/``; publishing bind-mounts ``<staging>/<volume id>`` at the
target (root ``/<volume id>``). Two volumes staged at once are two mounts of one superblock:
exactly what makes the kubelet's unstage check (Kubernetes issue 105323) refuse, which is
what this mode exists to exercise.

The controller reaches the filesystem through a short-lived mount in ``<state>/work``,
made for each operation and removed after it, so the only lasting mounts of the device are
the ones the CO asked for. The loop device is attached on first use and detached when no
mount in this mount namespace uses it any more.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator

from kubevol.csi import types as t
from kubevol.csidriver.drivers.engine.backend import Source
from kubevol.csidriver.drivers.engine.records import (
    Publication,
    SnapshotRecord,
    Staging,
    VolumeRecord,
)
from kubevol.csidriver.drivers.engine.rpc import Code, fail
from kubevol.csidriver.drivers.hostpath import loop
from kubevol.csidriver.drivers.hostpath.backend import (
    HEALTHY,
    HostPathBackend,
    check_staging_dir,
    copy_tree,
    mounted,
    storage_name,
    unmount_all,
)
from kubevol.errors import MountError
from kubevol.mount import LinuxMounter

#: Where snapshots live inside the shared filesystem.
SNAPSHOTS_DIR = ".snapshots"
FS_TYPE = "ext4"


def make_image(path: str, size: int) -> None:
    """Create a sparse ``size``-byte image at ``path`` holding an empty ext4 filesystem."""
    with open(path, "xb") as f:
        f.truncate(size)
    result = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-E", "root_owner=0:0", path],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        os.unlink(path)
        raise MountError(f"mkfs.ext4 {path} failed: {result.stderr.strip()}")


class SharedFilesystem:
    """The one ext4 image, its loop device, and short-lived controller mounts of it."""

    def __init__(self, image: str, work_dir: str, mounter: LinuxMounter) -> None:
        self.image = image
        self.work_dir = work_dir
        self.mounter = mounter
        self._lock = threading.Lock()
        self._users = 0
        os.makedirs(work_dir, mode=0o700, exist_ok=True)

    @contextlib.contextmanager
    def device(self) -> Iterator[str]:
        """The loop device, attached if needed, kept attached while the block runs; after
        it, detached unless a mount uses it."""
        with self._lock:
            dev = loop.attach_once(self.image)
            self._users += 1
        try:
            yield dev
        finally:
            with self._lock:
                self._users -= 1
            self.release_if_unused()

    def release_if_unused(self) -> None:
        """Detach every loop device of the image that no mount (here) and no call uses."""
        with self._lock:
            if self._users:
                return
            table = self.mounter.table()
            for dev in loop.devices_for(self.image):
                if not table.with_device(*loop.device_number(dev)):
                    loop.detach(dev)

    @contextlib.contextmanager
    def mounted(self) -> Iterator[str]:
        """The filesystem's root, mounted privately for the duration of the block."""
        with self.device() as dev:
            where = tempfile.mkdtemp(prefix="fs-", dir=self.work_dir)
            try:
                self.mounter.mount(dev, where, FS_TYPE, ())
                try:
                    yield where
                finally:
                    unmount_all(self.mounter, where)
            finally:
                with contextlib.suppress(OSError):
                    os.rmdir(where)


class SharedFilesystemBackend(HostPathBackend):
    """Mount volumes as sub-directories of one shared ext4 filesystem (no block access)."""

    def __init__(self, root: str, image: str, size: int, mounter: LinuxMounter | None = None):
        super().__init__(root, mounter)
        if not os.path.exists(image):
            make_image(image, size)
        self.fs = SharedFilesystem(image, os.path.join(root, "work"), self.mounter)
        with self.fs.mounted() as where:
            os.makedirs(os.path.join(where, SNAPSHOTS_DIR), mode=0o700, exist_ok=True)

    @staticmethod
    def _in_fs(root: str, record: VolumeRecord | SnapshotRecord) -> str:
        if isinstance(record, SnapshotRecord):
            name = storage_name(record.snapshot_id, "snapshot")
            return os.path.join(root, SNAPSHOTS_DIR, name)
        return os.path.join(root, storage_name(record.volume_id, "volume"))

    def create_volume(self, volume: VolumeRecord, source: Source) -> None:
        """Make ``/<id>`` (mode 0777), filled from a snapshot or volume when given."""
        with self.fs.mounted() as root:
            path = self._in_fs(root, volume)
            if os.path.lexists(path):
                return
            tmp = os.path.join(root, f".{volume.volume_id}.partial")
            self._remove(tmp)
            if source is not None:
                src = self._in_fs(root, source)
                if not os.path.isdir(src):
                    fail(Code.NOT_FOUND, f"the source's directory {src} is missing")
                copy_tree(src, tmp)
            else:
                os.mkdir(tmp)
                os.chmod(tmp, 0o777)
            os.rename(tmp, path)

    def delete_volume(self, volume: VolumeRecord) -> None:
        """Remove ``/<id>`` (a private mount of the filesystem has nothing mounted inside)."""
        with self.fs.mounted() as root:
            self._remove(self._in_fs(root, volume))

    def expand_volume(self, volume: VolumeRecord, new_size: int) -> bool:
        """Only the record grows: the sub-directory has no size of its own."""
        return False

    def create_snapshot(self, snapshot: SnapshotRecord, volume: VolumeRecord) -> None:
        """Copy ``/<volume id>`` to ``/.snapshots/<snapshot id>``."""
        with self.fs.mounted() as root:
            dest = self._in_fs(root, snapshot)
            if os.path.lexists(dest):
                return
            src = self._in_fs(root, volume)
            if not os.path.isdir(src):
                fail(Code.FAILED_PRECONDITION, f"volume directory {src} is missing")
            tmp = os.path.join(root, SNAPSHOTS_DIR, f".{snapshot.snapshot_id}.partial")
            self._remove(tmp)
            copy_tree(src, tmp)
            os.rename(tmp, dest)

    def delete_snapshot(self, snapshot: SnapshotRecord) -> None:
        """Remove the snapshot's copy."""
        with self.fs.mounted() as root:
            self._remove(self._in_fs(root, snapshot))

    def volume_condition(self, volume: VolumeRecord) -> t.VolumeCondition:
        """Abnormal when ``/<id>`` is gone (looked up through the staging mount when there
        is one, else through a private mount)."""
        if volume.staging is not None and mounted(self.mounter, volume.staging.path):
            return self._dir_condition(volume.staging.path, volume)
        with self.fs.mounted() as root:
            return self._dir_condition(root, volume)

    def _dir_condition(self, root: str, volume: VolumeRecord) -> t.VolumeCondition:
        if not os.path.isdir(self._in_fs(root, volume)):
            return t.VolumeCondition(
                abnormal=True,
                message=f"directory /{volume.volume_id} is missing from the shared filesystem",
            )
        return HEALTHY

    def health_problem(self) -> str | None:
        """The image must exist besides the state directory being writable."""
        if not os.path.exists(self.fs.image):
            return f"shared filesystem image {self.fs.image} is missing"
        return super().health_problem()

    def stage(self, volume: VolumeRecord, staging: Staging, *, repeat: bool) -> Staging:
        """Mount the shared device at the staging path (root ``/``, one device for all).
        A mount already there is reused only on a repeat, and only if it is the device's."""
        check_staging_dir(staging.path)
        with self.fs.device() as dev:
            if mounted(self.mounter, staging.path):
                if not (repeat and self._shows_device(staging.path, dev)):
                    fail(
                        Code.FAILED_PRECONDITION,
                        f"staging path {staging.path} is already a mount point this driver "
                        "did not make; left alone",
                    )
            else:
                access = staging.capability.access_type
                flags = access.mount_flags if isinstance(access, t.MountAccess) else ()
                self.mounter.mount(dev, staging.path, FS_TYPE, flags)
        if staging.device == dev:
            return staging
        return Staging(path=staging.path, capability=staging.capability, device=dev)

    @staticmethod
    def _shows_device(path: str, device: str) -> bool:
        """Whether the filesystem mounted at ``path`` is the one on ``device``."""
        try:
            return os.stat(path).st_dev == os.stat(device).st_rdev
        except OSError:
            return False

    def stage_leftover(self, volume: VolumeRecord, staging: Staging) -> bool:
        """The shared device still mounted at the staging path."""
        devices = loop.devices_for(self.fs.image)
        return mounted(self.mounter, staging.path) and any(
            self._shows_device(staging.path, d) for d in devices
        )

    def unstage(self, volume: VolumeRecord, staging: Staging) -> None:
        """Unmount the device from the staging path (never another mount found there);
        detach the device when nothing uses it any more."""
        for _ in range(8):
            if not mounted(self.mounter, staging.path):
                break
            if staging.device and not self._shows_device(staging.path, staging.device):
                fail(
                    Code.FAILED_PRECONDITION,
                    f"{staging.path} has a mount this driver did not make; left in place",
                )
            self.mounter.unmount(staging.path)
        self.fs.release_if_unused()

    def publish(
        self,
        volume: VolumeRecord,
        publication: Publication,
        staging: Staging | None,
        *,
        repeat: bool,
    ) -> None:
        """Bind ``<staging>/<volume id>`` at the target."""
        staged = self._publish_source(volume, staging)
        source = os.path.join(staged, storage_name(volume.volume_id, "volume"))
        if not os.path.isdir(source):
            fail(Code.FAILED_PRECONDITION, f"{source} is missing from the shared filesystem")
        self.bind_at_target(source, publication, volume.kind, repeat=repeat)

    def _target_source(self, volume: VolumeRecord, publication: Publication) -> str:
        """``<staging>/<volume id>``, bound at every target."""
        if volume.staging is None:
            return publication.target_path
        return os.path.join(volume.staging.path, storage_name(volume.volume_id, "volume"))

    def measure(self, volume: VolumeRecord, path: str) -> tuple[t.VolumeUsage, ...]:
        """du of the volume's directory (through the staging mount for a staging path)."""
        if volume.staging is not None and path == volume.staging.path:
            path = os.path.join(path, volume.volume_id)
        return super().measure(volume, path)

    def close(self) -> None:
        """Detach the device if no mount uses it."""
        self.fs.release_if_unused()
