"""The helpers every check uses, and the first patterns: ``volumes``, ``volume_io``,
``multivolume``, ``volumemode``, ``volume_expand`` (online), ``subpath`` (existing file and
directory) and ``disruptive``.

A "pod's container" is the node side's view of it: the pod volume directory (what the
container runtime would bind into the container), the subPath binds, the pod's device link.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable

import attrs

from kubevol.csi import types as t
from kubevol.errors import KubevolError, MetricsError
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped
from kubevol.testing.e2e.session import (
    MiB,
    Session,
    Volume,
    is_mount_point,
    mount_options_at,
)

#: Where the upstream tests live.
UPSTREAM = "kubernetes/kubernetes test/e2e/storage/testsuites/"
#: Mount options that show in /proc/self/mountinfo when they are applied.
VFS_FLAGS = frozenset({"ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime", "relatime"})

NC = t.NodeCapability


@attrs.frozen(kw_only=True)
class Check:
    """One check: its name (``pattern/case``), the upstream test it mirrors, its body;
    ``data`` when it needs the volume really mounted and keeping data (skipped against a
    mock driver, ``E2EConfig.mock``)."""

    name: str
    mirrors: str
    body: Callable[[Session], None]
    data: bool = True


# -- data in a pod ------------------------------------------------------------------------------


def payload(size: int, seed: str) -> bytes:
    """``size`` bytes, distinct per ``seed``."""
    block = hashlib.sha256(seed.encode()).digest() * 2048  # 64 KiB, distinct per seed
    return (block * (size // len(block) + 1))[:size]


def write_file(path: str, data: bytes, what: str) -> None:
    """Write ``data`` to ``path`` and flush it to the volume; CheckFailed when refused."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise CheckFailed(
            f"{what}: writing {path} failed: {exc}",
            expected="a writable volume at the pod's path",
            why="CSI spec NodePublishVolume: the volume is available read-write at "
                "target_path unless readonly is set",
        ) from exc


def read_back(path: str, data: bytes, what: str, why: str) -> None:
    """CheckFailed unless ``path`` holds exactly ``data``."""
    try:
        with open(path, "rb") as f:
            found = f.read()
    except OSError as exc:
        raise CheckFailed(f"{what}: {path} cannot be read: {exc}",
                          expected=f"the {len(data)} bytes written before", why=why) from exc
    if found != data:
        raise CheckFailed(
            f"{what}: {path} holds {len(found)} bytes (sha256 "
            f"{hashlib.sha256(found).hexdigest()[:16]}), not the {len(data)} bytes written "
            f"(sha256 {hashlib.sha256(data).hexdigest()[:16]})",
            expected="the data written before", why=why,
        )


def expect_mounted(path: str, rpc: str) -> None:
    """CheckFailed unless something is mounted at ``path`` (after ``rpc`` answered OK)."""
    if not is_mount_point(path):
        raise CheckFailed(
            f"{rpc} answered OK but nothing is mounted at {path}",
            expected=f"the volume mounted at the path the kubelet gave {rpc}",
            why="CSI spec: after NodeStageVolume the volume is mounted at staging_target_path,"
                " after NodePublishVolume at target_path (the kubelet hands target_path to "
                "the container runtime)",
        )


def device_size(path: str) -> int:
    """The size of the block device at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def pwrite(path: str, data: bytes, offset: int) -> None:
    """Write ``data`` at ``offset`` of the device at ``path`` and flush it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def pread(path: str, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset`` of the device at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def expect_block_device(path: str) -> None:
    """CheckFailed unless ``path`` (the pod's device link) resolves to a block device."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise CheckFailed(f"the pod's device {path} is missing: {exc}",
                          expected="a link to the volume's block device",
                          why="the kubelet maps a block volume to a device the container "
                              "gets (pods/<uid>/volumeDevices/...)") from exc
    if not stat.S_ISBLK(mode):
        raise CheckFailed(
            f"the pod's device {path} is not a block device (mode {stat.filemode(mode)})",
            expected="a block device",
            why="volumeMode: Block gives the container a raw device",
        )


# -- volumes / volume_io ------------------------------------------------------------------------


def store_data(s: Session) -> None:
    vol = s.create_volume()
    first = s.run_pod([vol], "starting the writer pod")
    path = s.box.volume_path(first, vol.name)
    expect_mounted(path, "NodePublishVolume")
    data = payload(4096, vol.handle)
    write_file(os.path.join(path, "index.html"), data, "the writer pod")
    s.delete_pod(first, "deleting the writer pod")
    second = s.run_pod([vol], "starting the reader pod")
    read_back(os.path.join(s.box.volume_path(second, vol.name), "index.html"), data,
              "the reader pod",
              why="volumes.go 'should store data': what one pod writes, the next pod on "
                  "the volume reads (the driver published the volume, not a directory of its"
                  " own)")


def various_sizes(s: Session) -> None:
    vol = s.create_volume()
    largest = max(MiB, min(16 * MiB, vol.capacity // 4))
    sizes = sorted({MiB, largest})
    first = s.run_pod([vol], "starting the writer pod")
    path = s.box.volume_path(first, vol.name)
    files = {size: payload(size, f"{vol.handle}-{size}") for size in sizes}
    for size, data in files.items():
        write_file(os.path.join(path, f"io-test-{size}"), data, "the writer pod")
        read_back(os.path.join(path, f"io-test-{size}"), data, "the writer pod",
                  why="volume_io.go: a file written is read back with the same size and "
                      "content")
    s.delete_pod(first, "deleting the writer pod")
    second = s.run_pod([vol], "starting the reader pod")
    for size, data in files.items():
        read_back(os.path.join(s.box.volume_path(second, vol.name), f"io-test-{size}"), data,
                  "the reader pod", why="volume_io.go: data survives the pod")


def volume_stats(s: Session) -> None:
    s.need_node(NC.GET_VOLUME_STATS, "the kubelet's volume stats come from NodeGetVolumeStats")
    vol = s.create_volume()
    uid = s.run_pod([vol], "starting the pod")
    written = 4 * MiB
    write_file(os.path.join(s.box.volume_path(uid, vol.name), "fill"),
               payload(written, "stats"), "the pod")
    try:
        m = s.box.metrics(uid, vol.name)
    except (MetricsError, KubevolError) as exc:
        raise CheckFailed(
            f"NodeGetVolumeStats at the pod's target path failed: {exc}",
            expected="usage in bytes (and inodes) of the volume",
            why="the driver advertises GET_VOLUME_STATS; the kubelet reports "
                "kubelet_volume_stats_* from it (volume_metrics.go)",
        ) from exc
    why = ("test/e2e/storage/volume_metrics.go: kubelet_volume_stats_capacity_bytes and "
           "used_bytes of a mounted claim come from NodeGetVolumeStats")
    if not m.capacity:
        raise CheckFailed("NodeGetVolumeStats reported no capacity (total bytes 0)",
                          expected="the volume's capacity in bytes", why=why)
    if (m.used or 0) < written:
        raise CheckFailed(
            f"NodeGetVolumeStats reported {m.used} bytes used after the pod wrote {written}",
            expected=f"at least {written} bytes used", why=why)
    if m.abnormal:
        raise CheckFailed(f"NodeGetVolumeStats says a healthy volume is abnormal: {m.message}",
                          expected="volume_condition.abnormal false",
                          why="CSI spec VolumeCondition: abnormal only when the volume is not "
                              "usable")


def mount_options(s: Session) -> None:
    wanted = [o for o in s.config.mount_options if o in VFS_FLAGS]
    if not wanted:
        raise CheckSkipped("no mount option the kernel shows in mountinfo was given "
                           f"({', '.join(s.config.mount_options) or 'none'})")
    vol = s.create_volume()
    uid = s.run_pod([vol], "starting a pod whose PV has mountOptions",
                    mount_options=s.config.mount_options)
    path = s.box.volume_path(uid, vol.name)
    expect_mounted(path, "NodePublishVolume")
    found = mount_options_at(path) or set()
    missing = [o for o in wanted if o not in found]
    if missing:
        raise CheckFailed(
            f"the pod's mount at {path} lacks mount options {missing} "
            f"(it has {','.join(sorted(found))})",
            expected=f"the PV's mountOptions {wanted} applied",
            why="provisioning.go 'should provision storage with mount options': the kubelet "
                "passes PV mountOptions as VolumeCapability.mount.mount_flags to NodeStage "
                "and NodePublish",
        )


def expect_read_only(directory: str, *, what: str, writer: str, why: str) -> None:
    """Creating a file in ``directory`` (``what``, for messages) is refused as a read-only
    mount refuses it; CheckFailed saying ``writer`` could write when it is not."""
    probe = os.path.join(directory, "must-not-exist")
    try:
        with open(probe, "wb") as f:
            f.write(b"x")
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return
        raise CheckFailed(f"writing to {what} failed oddly: {exc}",
                          expected="EROFS", why="a read-only mount refuses writes") from exc
    os.unlink(probe)
    raise CheckFailed(f"{writer} could write {probe}", expected=f"{what}: a read-only mount "
                      "(EROFS)", why=why)


def read_only(s: Session) -> None:
    vol = s.create_volume()
    uid = s.run_pod([vol], "starting a pod with a readOnly claim", read_only=True)
    path = s.box.volume_path(uid, vol.name)
    expect_mounted(path, "NodePublishVolume")
    expect_read_only(
        path, what="the read-only volume", writer="a pod whose claim is readOnly",
        why="the kubelet sends NodePublishVolumeRequest.readonly=true for a readOnly claim "
            "(pkg/volume/csi/csi_mounter.go); CSI spec: the SP MUST publish it read-only",
    )


# -- multivolume --------------------------------------------------------------------------------


def two_volumes(s: Session) -> None:
    a, b = s.create_volume(), s.create_volume()
    first = s.run_pod([a, b], "starting a pod with two volumes")
    data = {v.name: payload(8192, v.handle) for v in (a, b)}
    for v in (a, b):
        write_file(os.path.join(s.box.volume_path(first, v.name), "own"), data[v.name],
                   "the first pod")
    s.delete_pod(first, "deleting the first pod")
    second = s.run_pod([a, b], "recreating the pod")
    why = ("multivolume.go 'should access to two volumes with the same volume mode and retain "
           "data across pod recreation on the same node'")
    for v in (a, b):
        read_back(os.path.join(s.box.volume_path(second, v.name), "own"), data[v.name],
                  f"volume {v.name} in the recreated pod", why=why)


def one_volume_two_pods(s: Session) -> None:
    s.need_node(NC.SINGLE_NODE_MULTI_WRITER,
                "without it a ReadWriteOnce volume is published SINGLE_NODE_WRITER, which "
                "CSI allows a driver to publish to one target only")
    vol = s.create_volume()
    mark = s.relay.mark()
    first = s.run_pod([vol], "starting the first pod")
    second = s.run_pod([vol], "starting the second pod on the same node")
    why = ("multivolume.go 'should concurrently access the single volume from pods on the "
           "same node'")
    p1, p2 = s.box.volume_path(first, vol.name), s.box.volume_path(second, vol.name)
    staged = s.calls("NodeStageVolume", mark)
    if NC.STAGE_UNSTAGE_VOLUME in s.info.node and len(staged) != 1:
        raise CheckFailed(f"the volume was staged {len(staged)} times for two pods",
                          expected="one NodeStageVolume (the pods share the staging)", why=why)
    one, two = payload(4096, "one"), payload(4096, "two")
    write_file(os.path.join(p1, "from-1"), one, "the first pod")
    read_back(os.path.join(p2, "from-1"), one, "the second pod, while the first runs", why)
    write_file(os.path.join(p2, "from-2"), two, "the second pod")
    read_back(os.path.join(p1, "from-2"), two, "the first pod, while the second runs", why)
    mark = s.relay.mark()
    s.delete_pod(first, "deleting the first pod")
    if s.calls("NodeUnstageVolume", mark):
        raise CheckFailed("the volume was unstaged while the second pod still used it",
                          expected="no NodeUnstageVolume while a pod uses the volume",
                          why=why + "; the kubelet unstages when no pod uses the volume")
    read_back(os.path.join(p2, "from-1"), one,
              "the second pod, after the first was deleted",
              why + ": NodeUnpublishVolume of one target must leave the other working")
    write_file(os.path.join(p2, "after"), two, "the second pod, after the first was deleted")
    s.delete_pod(second, "deleting the second pod")
    if NC.STAGE_UNSTAGE_VOLUME in s.info.node and not s.calls("NodeUnstageVolume", mark):
        raise CheckFailed("the volume was not unstaged after its last pod left",
                          expected="one NodeUnstageVolume once no pod uses it", why=why)


# -- volumemode ---------------------------------------------------------------------------------


def block_io(s: Session) -> None:
    vol = s.create_volume(block=True)
    first = s.run_pod([vol], "starting a pod with a block volume")
    dev = s.box.device_path(first, vol.name)
    expect_block_device(dev)
    why = ("volumemode.go 'should create sc, pod, pv, and pvc, read/write to the pv, and "
           "delete all created resources' (Block): the pod's device is the volume")
    size = device_size(dev)
    if size < vol.capacity:
        raise CheckFailed(f"the pod's device has {size} bytes, the volume {vol.capacity}",
                          expected=f"at least {vol.capacity} bytes", why=why)
    data = payload(MiB, vol.handle)
    offset = (size // 2) & ~(MiB - 1)
    pwrite(dev, data, offset)
    s.delete_pod(first, "deleting the pod")
    second = s.run_pod([vol], "starting a second pod with the block volume")
    dev2 = s.box.device_path(second, vol.name)
    expect_block_device(dev2)
    if pread(dev2, len(data), offset) != data:
        raise CheckFailed(
            f"what the first pod wrote at offset {offset} of its device is not on the "
            "second pod's device",
            expected="the same bytes: both pods get the volume's device",
            why=why + "; NodePublishVolume must bind the volume's device at target_path, "
                      "not a copy of it",
        )


# -- volume_expand ------------------------------------------------------------------------------


def controller_expand(s: Session, vol: Volume, size: int) -> int:
    """Grow ``vol`` to ``size`` bytes as the external-resizer does first (ControllerExpand,
    when the controller advertises EXPAND_VOLUME); the size the claim then asks for."""
    if t.ControllerCapability.EXPAND_VOLUME not in s.info.controller:
        return size
    try:
        grown = s.client.controller_expand_volume(
            vol.handle, t.CapacityRange(required_bytes=size),
            secrets=s.config.secrets.for_rpc("ControllerExpandVolume"))
    except KubevolError as exc:
        raise CheckFailed(f"ControllerExpandVolume to {size} bytes failed: {exc}",
                          expected="the volume grown",
                          why="the external-resizer grows the volume before the node") from exc
    return max(size, grown.capacity_bytes)


def _expand(s: Session, *, block: bool) -> None:
    s.need_node(NC.EXPAND_VOLUME, "the kubelet calls NodeExpandVolume only then")
    if t.VolumeExpansionType.ONLINE not in s.info.plugin.volume_expansion:
        raise CheckSkipped("the driver does not advertise ONLINE volume expansion")
    vol = s.create_volume(block=block)
    uid, pod = s.pod([vol])
    s.box.run_pods([*s.claim_objects(vol), pod], "starting the pod")
    where = s.box.device_path(uid, vol.name) if block else s.box.volume_path(uid, vol.name)

    def size_now() -> int:
        if block:
            return device_size(where)
        st = os.statvfs(where)
        return st.f_blocks * st.f_frsize

    before = size_now()
    new = controller_expand(s, vol, vol.capacity * 2)
    mark = s.relay.mark()
    s.box.run_pods([*s.claim_objects(vol, capacity=new), pod],
                   "the PV grown while the pod runs")
    if not s.calls("NodeExpandVolume", mark):
        raise CheckFailed("the node side did not call NodeExpandVolume",
                          expected="NodeExpandVolume once the PV is larger",
                          why="the kubelet expands online when the claim grows")
    after = size_now()
    why = ("volume_expand.go 'should resize volume when PVC is edited while pod is using it':"
           " after NodeExpandVolume answered OK the pod sees the new size")
    if block and after < new:
        raise CheckFailed(f"the pod's device has {after} bytes after expansion to {new}",
                          expected=f"{new} bytes", why=why)
    if not block and before < new and after <= before:
        raise CheckFailed(
            f"the filesystem at the pod's path still has {after} bytes after expansion to "
            f"{new} (it had {before})", expected="a larger filesystem", why=why)


def expand_filesystem(s: Session) -> None:
    _expand(s, block=False)


def expand_block(s: Session) -> None:
    _expand(s, block=True)


# -- subpath ------------------------------------------------------------------------------------


def subpath_directory(s: Session) -> None:
    vol = s.create_volume()
    mounts = [{"name": "v0", "mountPath": "/sub", "subPath": "sub/dir"}]
    first = s.run_pod([vol], "starting a pod with a directory subPath", mounts=mounts)
    bound = s.box.subpath(first, vol.name, "c", 1)
    why = ("subpath.go 'should support existing directory': the subPath bind shows the "
           "directory inside the volume the driver published")
    if not is_mount_point(bound):
        raise CheckFailed(f"the subPath bind {bound} is not a mount", expected="a bind mount",
                          why=why)
    data = payload(4096, "subpath")
    write_file(os.path.join(bound, "file"), data, "the pod, through its subPath")
    read_back(os.path.join(s.box.volume_path(first, vol.name), "sub", "dir", "file"), data,
              "the pod, through the volume root", why)
    s.delete_pod(first, "deleting the pod")
    second = s.run_pod([vol], "starting a pod without subPath")
    read_back(os.path.join(s.box.volume_path(second, vol.name), "sub", "dir", "file"), data,
              "the next pod", why + "; the data is on the volume")


def subpath_file(s: Session) -> None:
    vol = s.create_volume()
    first = s.run_pod([vol], "starting a pod that writes a file")
    data = payload(3000, "file")
    write_file(os.path.join(s.box.volume_path(first, vol.name), "conf"), data, "the pod")
    s.delete_pod(first, "deleting the pod")
    mounts = [{"name": "v0", "mountPath": "/etc/conf", "subPath": "conf"}]
    second = s.run_pod([vol], "starting a pod with a file subPath", mounts=mounts)
    bound = s.box.subpath(second, vol.name, "c", 1)
    read_back(bound, data, "the file subPath",
              why="subpath.go 'should support existing single file': a file subPath binds "
                  "that file of the volume")


# -- disruptive ---------------------------------------------------------------------------------


def _kubelet_restart(s: Session, *, block: bool) -> None:
    vol = s.create_volume(block=block)
    uid = s.run_pod([vol], "starting the pod")
    data = payload(MiB, vol.handle)
    where = s.box.device_path(uid, vol.name) if block else os.path.join(
        s.box.volume_path(uid, vol.name), "before-restart")
    if block:
        pwrite(where, data, 0)
    else:
        write_file(where, data, "the pod")
    mark = s.relay.mark()
    s.box.kill()
    s.box.start()
    why = ("disruptive.go 'Should test that pv written before kubelet restart is readable "
           "after restart.'")
    if uid not in s.box.pods.manager.actual.pods():
        raise CheckFailed("reconstruction did not find the pod's volume after the restart",
                          expected="the volume in use, rebuilt from disk", why=why)
    s.box.sync("syncing after the restart")
    torn = s.calls("NodeUnpublishVolume", mark) + s.calls("NodeUnstageVolume", mark)
    if torn:
        raise CheckFailed(f"the restarted node side tore down a volume in use: {torn[0]}",
                          expected="nothing unmounted", why=why)
    if block:
        if pread(where, len(data), 0) != data:
            raise CheckFailed("the pod's device lost what was written before the restart",
                              expected="the same bytes", why=why)
    else:
        expect_mounted(s.box.volume_path(uid, vol.name), "NodePublishVolume")
        read_back(where, data, "the pod after the restart", why)


def kubelet_restart_filesystem(s: Session) -> None:
    _kubelet_restart(s, block=False)


def kubelet_restart_block(s: Session) -> None:
    _kubelet_restart(s, block=True)


def _deleted_while_down(s: Session, *, block: bool, unpublished_before: bool = False) -> None:
    vol = s.create_volume(block=block)
    uid = s.run_pod([vol], "starting the pod")
    target = s.box.volume_path(uid, vol.name)
    s.box.kill()
    mark = s.relay.mark()
    if unpublished_before:
        # The kubelet had sent NodeUnpublishVolume and crashed before it recorded it: it
        # sends it again after the restart (reconstruction finds the volume directory).
        s.client.node_unpublish_volume(vol.handle, target)
    repeated = s.relay.mark()
    s.box.delete_pod_while_down(uid)
    s.box.start()
    why = ("disruptive.go 'Should test that pv used in a pod that is deleted while the "
           "kubelet is down cleans up when the kubelet returns.'")
    if unpublished_before:
        why = ("CSI spec: NodeUnpublishVolume MUST be idempotent (a kubelet that crashed after "
               "sending it sends it again); " + why)
    s.box.sync("cleaning up after the restart")
    refused = [c for c in s.relay.calls_since(repeated, ("NodeUnpublishVolume",)) if not c.ok]
    if refused:
        raise CheckFailed(
            f"NodeUnpublishVolume of a target already unpublished was answered {refused[0].code}"
            f": {refused[0].message}",
            expected="OK (nothing to do)", why=why)
    if not s.calls("NodeUnpublishVolume", mark):
        raise CheckFailed("the deleted pod's volume was not unpublished",
                          expected="NodeUnpublishVolume", why=why)
    pod_dir = os.path.join(s.box.root, "pods", uid)
    if os.path.lexists(pod_dir):
        raise CheckFailed(f"the deleted pod's directory {pod_dir} is still there",
                          expected="the pod's volumes torn down and its directory removed",
                          why=why)


def deleted_while_down_filesystem(s: Session) -> None:
    _deleted_while_down(s, block=False)


def deleted_while_down_block(s: Session) -> None:
    _deleted_while_down(s, block=True)


def unpublish_repeated_after_crash(s: Session) -> None:
    _deleted_while_down(s, block=False, unpublished_before=True)


def driver_restart(s: Session) -> None:
    if s.restart_driver is None:
        raise CheckSkipped("no --driver-command: the suite cannot restart the driver")
    vol = s.create_volume()
    uid = s.run_pod([vol], "starting the pod")
    data = payload(MiB, vol.handle)
    path = s.box.volume_path(uid, vol.name)
    write_file(os.path.join(path, "before"), data, "the pod")
    s.restart_driver()
    why = ("the driver restarted while its volumes are in use still has them (the "
           "restart keeps the mounts)")
    read_back(os.path.join(path, "before"), data, "the pod, after the driver restarted", why)
    try:
        s.delete_pod(uid, "deleting the pod after the driver restarted")
    except CheckFailed:
        s.expect_targets_unmounted()  # the cause, when it is that
        raise


def check(name: str, mirrors: str, body: Callable[[Session], None], *,
          data: bool = True) -> Check:
    """A :class:`Check` mirroring ``mirrors`` (a file of :data:`UPSTREAM` and its ``It``)."""
    return Check(name=name, mirrors=UPSTREAM + mirrors, body=body, data=data)


_c = check

#: The checks of this module, in the order they run.
CORE_CHECKS: tuple[Check, ...] = (
    _c("volumes/store-data", "volumes.go: should store data", store_data),
    _c("volume_io/various-sizes",
       "volume_io.go: should write files of various sizes, verify size, validate content",
       various_sizes),
    _c("volumes/stats", "../volume_metrics.go: should create volume metrics with the correct "
       "FilesystemMode PVC ref", volume_stats),
    _c("volumes/mount-options", "provisioning.go: should provision storage with mount options",
       mount_options),
    _c("volumes/read-only-claim", "(no It; pkg/volume/csi/csi_mounter.go SetUpAt sends "
       "readonly for a readOnly claim)", read_only),
    _c("multivolume/two-volumes-one-pod", "multivolume.go: should access to two volumes with "
       "the same volume mode and retain data across pod recreation on the same node",
       two_volumes),
    _c("multivolume/one-volume-two-pods", "multivolume.go: should concurrently access the "
       "single volume from pods on the same node", one_volume_two_pods),
    _c("volumemode/block-io", "volumemode.go: should create sc, pod, pv, and pvc, read/write "
       "to the pv, and delete all created resources", block_io),
    _c("volume_expand/online-filesystem", "volume_expand.go: should resize volume when PVC is "
       "edited while pod is using it", expand_filesystem),
    _c("volume_expand/online-block", "volume_expand.go: should resize volume when PVC is "
       "edited while pod is using it (Block)", expand_block),
    _c("subpath/directory", "subpath.go: should support existing directory",
       subpath_directory),
    _c("subpath/file", "subpath.go: should support existing single file", subpath_file),
    _c("disruptive/kubelet-restart-filesystem", "disruptive.go: Should test that pv written "
       "before kubelet restart is readable after restart.", kubelet_restart_filesystem),
    _c("disruptive/kubelet-restart-block", "disruptive.go: Should test that pv written before "
       "kubelet restart is readable after restart. (Block)", kubelet_restart_block),
    _c("disruptive/deleted-while-down-filesystem", "disruptive.go: Should test that pv used in "
       "a pod that is deleted while the kubelet is down cleans up when the kubelet returns.",
       deleted_while_down_filesystem, data=False),
    _c("disruptive/deleted-while-down-block", "disruptive.go: Should test that pv used in a "
       "pod that is deleted while the kubelet is down cleans up when the kubelet returns. "
       "(Block)", deleted_while_down_block, data=False),
    _c("disruptive/unpublish-repeated-after-crash", "disruptive.go (deleted while down) with "
       "NodeUnpublishVolume already sent before the crash", unpublish_repeated_after_crash,
       data=False),
    _c("disruptive/driver-restart", "(issue 33: the driver restarted with volumes in use)",
       driver_restart),
)
