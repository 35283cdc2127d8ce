"""Covers kubevol.csidriver.drivers.hostpath.

The hostpath driver on real mounts and loop devices, over a real unix socket.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.engine.state import DriverStateError
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.csidriver.drivers.hostpath.state import SqliteStore
from kubevol.mount import get_mount_refs
from kubevol.mount.mountinfo import MountInfo, parse_mountinfo
from tests.csidriver.drivers.conftest import HostPathFactory, Served, loops_under, target_path

MiB = 1 << 20
MOUNT = t.VolumeCapability.mount()
BLOCK = t.VolumeCapability.block()

StagingDir = Callable[[str], str]


def entry_at(path: str) -> MountInfo | None:
    """The mountinfo entry mounted at ``path`` (the last one), or None."""
    found = [e for e in parse_mountinfo() if e.mount_point == path]
    return found[-1] if found else None


def must_entry(path: str) -> MountInfo:
    """The mountinfo entry at ``path``; fails the test when nothing is mounted there."""
    entry = entry_at(path)
    assert entry is not None, f"nothing mounted at {path}"
    return entry


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``call`` fails with."""
    with pytest.raises(CSIRPCError) as info:
        call()
    return info.value.code


def stage_and_publish(
    served: Served, tmp_path: Path, staging: str, cap: t.VolumeCapability, name: str = "vol"
) -> tuple[str, str]:
    """Create a 64 MiB volume, stage it at ``staging`` and publish it; (volume id, target)."""
    c = served.client
    vol = c.create_volume(name, [cap], capacity_range=t.CapacityRange(required_bytes=64 * MiB))
    c.node_stage_volume(vol.volume_id, staging, cap)
    target = target_path(tmp_path, name)
    c.node_publish_volume(vol.volume_id, target, cap, staging_target_path=staging)
    return vol.volume_id, target


@pytest.mark.root
def test_mount_lifecycle_uses_real_bind_mounts(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """Stage and publish are bind mounts of the volume directory; teardown removes all."""
    c = hostpath.client
    staging = staging_dir("s1")
    vid, target = stage_and_publish(hostpath, tmp_path, staging, MOUNT)
    voldir = tmp_path / "state" / "volumes" / vid
    assert entry_at(staging) is not None and entry_at(target) is not None
    Path(target, "data.txt").write_text("hello")
    assert (voldir / "data.txt").read_text() == "hello"
    # Repeats are no-ops: no stacked mounts.
    c.node_stage_volume(vid, staging, MOUNT)
    c.node_publish_volume(vid, target, MOUNT, staging_target_path=staging)
    assert sum(e.mount_point == target for e in parse_mountinfo()) == 1
    c.node_unpublish_volume(vid, target)
    assert not os.path.lexists(target)
    c.node_unpublish_volume(vid, target)
    c.node_unstage_volume(vid, staging)
    assert entry_at(staging) is None and os.path.isdir(staging)
    c.delete_volume(vid)
    assert not voldir.exists()


@pytest.mark.root
def test_read_only_publish_refuses_writes(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """A read-only publish is remounted ro: writing through it fails with EROFS."""
    c = hostpath.client
    vol = c.create_volume("ro", [MOUNT])
    staging = staging_dir("ro")
    c.node_stage_volume(vol.volume_id, staging, MOUNT)
    target = target_path(tmp_path, "ro")
    c.node_publish_volume(vol.volume_id, target, MOUNT, staging_target_path=staging, readonly=True)
    with pytest.raises(OSError) as info:
        Path(target, "x").write_text("no")
    assert info.value.errno == errno.EROFS
    c.node_unpublish_volume(vol.volume_id, target)
    c.node_unstage_volume(vol.volume_id, staging)


@pytest.mark.root
def test_second_target_needs_a_multi_writer_mode(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """SINGLE_NODE_WRITER publishes once; SINGLE_NODE_MULTI_WRITER may publish twice."""
    c = hostpath.client
    staging = staging_dir("one")
    vid, _ = stage_and_publish(hostpath, tmp_path, staging, MOUNT)
    second = target_path(tmp_path, "second")
    assert (
        code_of(lambda: c.node_publish_volume(vid, second, MOUNT, staging_target_path=staging))
        == grpc.StatusCode.FAILED_PRECONDITION
    )
    multi = t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_MULTI_WRITER)
    staging2 = staging_dir("multi")
    vid2, first = stage_and_publish(hostpath, tmp_path, staging2, multi, name="multi")
    c.node_publish_volume(vid2, second, multi, staging_target_path=staging2)
    assert entry_at(second) is not None
    for volume_id, path in ((vid2, second), (vid2, first), (vid, target_path(tmp_path, "vol"))):
        c.node_unpublish_volume(volume_id, path)
    c.node_unstage_volume(vid, staging)
    c.node_unstage_volume(vid2, staging2)


@pytest.mark.root
def test_block_volume_binds_the_loop_device_onto_a_file(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """Block publish binds the loop device node at a file target; unstage detaches it."""
    c = hostpath.client
    staging = staging_dir("blk")
    vid, target = stage_and_publish(hostpath, tmp_path, staging, BLOCK)
    assert stat.S_ISBLK(os.stat(target).st_mode)
    with open(target, "r+b") as dev:
        dev.write(b"kubevol")
        dev.flush()
        os.fsync(dev.fileno())
        assert dev.seek(0, os.SEEK_END) == 64 * MiB
    image = tmp_path / "state" / "volumes" / f"{vid}.img"
    assert image.read_bytes()[:7] == b"kubevol"
    assert [img for _, img in loops_under(tmp_path)] == [str(image)]
    c.node_unpublish_volume(vid, target)
    assert not os.path.lexists(target)
    c.node_unstage_volume(vid, staging)
    assert loops_under(tmp_path) == []
    c.delete_volume(vid)
    assert not image.exists()


@pytest.mark.root
def test_read_only_block_publish_cannot_write(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """A read-only block publication is its own read-only loop device: writing to it
    fails; unpublishing detaches it and leaves the staging device."""
    c = hostpath.client
    multi = t.VolumeCapability.block(t.AccessMode.SINGLE_NODE_MULTI_WRITER)
    staging = staging_dir("roblk")
    vid, rw_target = stage_and_publish(hostpath, tmp_path, staging, multi, name="roblk")
    ro_target = target_path(tmp_path, "roblk-ro")
    c.node_publish_volume(vid, ro_target, multi, staging_target_path=staging, readonly=True)
    fd = os.open(ro_target, os.O_RDWR)
    try:
        with pytest.raises(OSError) as info:
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
    finally:
        os.close(fd)
    assert info.value.errno in (errno.EROFS, errno.EPERM)
    assert len(loops_under(tmp_path)) == 2
    c.node_unpublish_volume(vid, ro_target)
    assert len(loops_under(tmp_path)) == 1
    with open(rw_target, "r+b") as dev:
        dev.write(b"still writable")
    c.node_unpublish_volume(vid, rw_target)
    c.node_unstage_volume(vid, staging)
    assert loops_under(tmp_path) == []


@pytest.mark.root
def test_block_expansion_reaches_the_device(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """ControllerExpand grows the image; NodeExpand makes the loop device see the size."""
    c = hostpath.client
    staging = staging_dir("grow")
    vid, target = stage_and_publish(hostpath, tmp_path, staging, BLOCK)
    result = c.controller_expand_volume(vid, t.CapacityRange(required_bytes=96 * MiB))
    assert result.capacity_bytes == 96 * MiB and result.node_expansion_required
    assert c.node_expand_volume(vid, target) == 96 * MiB
    assert c.node_get_volume_stats(vid, target).usage[0].total == 96 * MiB
    again = c.controller_expand_volume(vid, t.CapacityRange(required_bytes=80 * MiB))
    assert again.capacity_bytes == 96 * MiB
    c.node_unpublish_volume(vid, target)
    c.node_unstage_volume(vid, staging)


@pytest.mark.root
def test_stats_and_volume_condition(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """Stats measure what was written; the condition turns abnormal when the volume's
    directory is deleted or the target is unmounted behind the driver's back."""
    c = hostpath.client
    staging = staging_dir("stats")
    vid, target = stage_and_publish(hostpath, tmp_path, staging, MOUNT)
    Path(target, "blob").write_bytes(b"x" * (3 * MiB))
    stats = c.node_get_volume_stats(vid, target)
    used = stats.by_unit(t.UsageUnit.BYTES)
    assert used is not None and used.used >= 3 * MiB and used.total == 64 * MiB
    assert stats.volume_condition == t.VolumeCondition(abnormal=False, message="volume is healthy")
    assert code_of(lambda: c.node_get_volume_stats(vid, "/no/such/path")) == (
        grpc.StatusCode.NOT_FOUND
    )
    voldir = tmp_path / "state" / "volumes" / vid
    os.rename(voldir, tmp_path / "moved")
    cond = c.node_get_volume_stats(vid, target).volume_condition
    assert cond is not None and cond.abnormal and "missing" in cond.message
    entry = c.controller_get_volume(vid)
    assert entry.status is not None and entry.status.volume_condition is not None
    assert entry.status.volume_condition.abnormal
    os.rename(tmp_path / "moved", voldir)
    subprocess.run(["umount", target], check=True)
    cond = c.node_get_volume_stats(vid, target).volume_condition
    assert cond is not None and cond.abnormal and "no longer mounted" in cond.message
    c.node_unpublish_volume(vid, target)
    c.node_unstage_volume(vid, staging)


def test_snapshots_are_copies_and_restore(
    hostpath_factory: HostPathFactory, tmp_path: Path
) -> None:
    """A snapshot keeps the content at its time; volumes from it and clones get copies
    (GetSnapshot, opted in, answers NOT_FOUND once the snapshot is deleted)."""
    c = hostpath_factory(get_snapshot=True).client
    vol = c.create_volume("src", [MOUNT])
    voldir = tmp_path / "state" / "volumes" / vol.volume_id
    (voldir / "f").write_text("v1")
    snap = c.create_snapshot(vol.volume_id, "snap")
    assert snap.ready_to_use and snap.source_volume_id == vol.volume_id
    assert c.create_snapshot(vol.volume_id, "snap") == snap
    (voldir / "f").write_text("v2")
    restored = c.create_volume(
        "restored", [MOUNT], content_source=t.SnapshotSource(snapshot_id=snap.snapshot_id)
    )
    assert restored.content_source == t.SnapshotSource(snapshot_id=snap.snapshot_id)
    assert (tmp_path / "state" / "volumes" / restored.volume_id / "f").read_text() == "v1"
    clone = c.create_volume(
        "clone", [MOUNT], content_source=t.VolumeSource(volume_id=vol.volume_id)
    )
    assert (tmp_path / "state" / "volumes" / clone.volume_id / "f").read_text() == "v2"
    assert c.list_snapshots(source_volume_id=vol.volume_id).entries == (snap,)
    c.delete_snapshot(snap.snapshot_id)
    assert not (tmp_path / "state" / "snapshots" / snap.snapshot_id).exists()
    assert code_of(lambda: c.get_snapshot(snap.snapshot_id)) == grpc.StatusCode.NOT_FOUND


@pytest.mark.root
def test_restarted_driver_keeps_volumes_and_publications(
    hostpath_factory: HostPathFactory, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """After a restart on the same state directory the driver still knows its volumes and
    where they are staged and published, and tears them down."""
    first = hostpath_factory()
    staging = staging_dir("restart")
    vid, target = stage_and_publish(first, tmp_path, staging, MOUNT)
    first.stop()
    assert entry_at(target) is not None
    store = SqliteStore(str(tmp_path / "state"))
    [stored] = store.load().volumes.values()
    store.close()
    assert [p.target_path for p in stored.publications.values()] == [target]
    second = hostpath_factory()
    c = second.client
    [entry] = c.list_volumes().entries
    assert entry.volume.volume_id == vid
    assert c.node_get_volume_stats(vid, target).usage
    c.node_publish_volume(vid, target, MOUNT, staging_target_path=staging)
    assert code_of(lambda: c.delete_volume(vid)) == grpc.StatusCode.FAILED_PRECONDITION
    c.node_unpublish_volume(vid, target)
    c.node_unstage_volume(vid, staging)
    c.delete_volume(vid)
    assert c.list_volumes().entries == ()


def test_state_directory_is_exclusive_and_checked(tmp_path: Path) -> None:
    """A second driver on a used state directory is refused; a corrupt state file is
    reported with its path instead of being overwritten."""
    config = HostPathConfig(state_dir=str(tmp_path / "state"), node_id="n")
    with HostPathDriver(config), pytest.raises(DriverStateError, match="in use"):
        HostPathDriver(config)
    garbage = b"not a database, not even close" * 100
    (tmp_path / "state" / "state.db").write_bytes(garbage)
    with pytest.raises(DriverStateError, match=r"state\.db"):
        HostPathDriver(config)
    assert (tmp_path / "state" / "state.db").read_bytes() == garbage


def test_capacity_is_accounted(hostpath_factory: HostPathFactory) -> None:
    """Volumes draw from the configured capacity; what does not fit is RESOURCE_EXHAUSTED,
    what exceeds the maximum volume size OUT_OF_RANGE."""
    c = hostpath_factory(capacity_bytes=100 * MiB, max_volume_size=80 * MiB).client
    c.create_volume("a", [MOUNT], capacity_range=t.CapacityRange(required_bytes=60 * MiB))
    assert c.get_capacity().available_capacity == 40 * MiB
    too_big = t.CapacityRange(required_bytes=60 * MiB)
    assert code_of(lambda: c.create_volume("b", [MOUNT], capacity_range=too_big)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    over_max = t.CapacityRange(required_bytes=90 * MiB)
    assert code_of(lambda: c.create_volume("c", [MOUNT], capacity_range=over_max)) == (
        grpc.StatusCode.OUT_OF_RANGE
    )


@pytest.mark.root
def test_attach_is_optional_and_limited(
    hostpath_factory: HostPathFactory, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """Without --enable-attach ControllerPublish is UNIMPLEMENTED; with it staging needs an
    attachment, unknown nodes are NOT_FOUND and the attach limit is enforced."""
    plain = hostpath_factory(state_dir=str(tmp_path / "plain")).client
    v = plain.create_volume("v", [MOUNT])
    assert code_of(lambda: plain.controller_publish_volume(v.volume_id, "node-1", MOUNT)) == (
        grpc.StatusCode.UNIMPLEMENTED
    )
    c = hostpath_factory(enable_attach=True, attach_limit=1).client
    assert t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME in c.controller_get_capabilities()
    assert c.node_get_info().max_volumes_per_node == 1
    a = c.create_volume("a", [MOUNT])
    b = c.create_volume("b", [MOUNT])
    staging = staging_dir("att")
    assert code_of(lambda: c.node_stage_volume(a.volume_id, staging, MOUNT)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    assert code_of(lambda: c.controller_publish_volume(a.volume_id, "other", MOUNT)) == (
        grpc.StatusCode.NOT_FOUND
    )
    c.controller_publish_volume(a.volume_id, "node-1", MOUNT)
    c.controller_publish_volume(a.volume_id, "node-1", MOUNT)
    assert code_of(lambda: c.controller_publish_volume(b.volume_id, "node-1", MOUNT)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert c.controller_get_volume(a.volume_id).status == t.VolumeStatus(
        published_node_ids=("node-1",),
        volume_condition=t.VolumeCondition(abnormal=False, message="volume is healthy"),
    )
    c.node_stage_volume(a.volume_id, staging, MOUNT)
    c.node_unstage_volume(a.volume_id, staging)
    c.controller_unpublish_volume(a.volume_id, "node-1")
    c.controller_unpublish_volume(a.volume_id, "node-1")
    c.controller_publish_volume(b.volume_id, "node-1", MOUNT)
    c.controller_unpublish_volume(b.volume_id)


@pytest.mark.root
def test_shared_filesystem_has_lustres_mount_shape(
    hostpath_factory: HostPathFactory, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """With a shared filesystem every staging mount is the same device with root "/",
    targets show "/<id>", the kubelet's mount-ref search sees the other volume's staging
    mount, and the loop device goes away after the last unstage."""
    served = hostpath_factory(
        shared_filesystem=str(tmp_path / "shared.img"), shared_filesystem_size=64 * MiB
    )
    c = served.client
    cap = t.VolumeCapability.mount(t.AccessMode.MULTI_NODE_MULTI_WRITER)
    stagings = [staging_dir(f"shared{i}") for i in range(2)]
    published = [
        stage_and_publish(served, tmp_path, stagings[i], cap, name=f"vol{i}") for i in range(2)
    ]
    staged = [must_entry(s) for s in stagings]
    targets = [must_entry(tp) for _, tp in published]
    assert {e.device for e in staged + targets} == {staged[0].device}
    assert [e.root for e in staged] == ["/", "/"]
    assert [e.root for e in targets] == [f"/{vid}" for vid, _ in published]
    assert stagings[1] in get_mount_refs(stagings[0])
    Path(published[0][1], "f").write_text("shared")
    assert Path(stagings[1], published[0][0], "f").read_text() == "shared"
    for (vid, target), staging in zip(published, stagings, strict=True):
        c.node_unpublish_volume(vid, target)
        c.node_unstage_volume(vid, staging)
    assert loops_under(tmp_path) == []
    assert code_of(lambda: c.create_volume("blk", [BLOCK])) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.root
def test_block_stats_at_a_bind_of_the_published_device(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir
) -> None:
    """NodeGetVolumeStats answers at a bind of a block volume's published device elsewhere
    (where the kubelet asks: its own bind under the global map path) with the device's
    size, and NOT_FOUND at a bind of another volume's device."""
    c = hostpath.client
    stagings = [staging_dir("stats-a"), staging_dir("stats-b")]
    vid, target = stage_and_publish(hostpath, tmp_path, stagings[0], BLOCK)
    other, other_target = stage_and_publish(hostpath, tmp_path, stagings[1], BLOCK, name="other")
    binds = []
    for name, source in (("mine", target), ("theirs", other_target)):
        bind = tmp_path / "map" / name
        bind.parent.mkdir(exist_ok=True)
        bind.touch()
        subprocess.run(["mount", "--bind", source, str(bind)], check=True)
        binds.append(str(bind))
    try:
        (usage,) = c.node_get_volume_stats(vid, binds[0]).usage
        assert (usage.unit, usage.total) == (t.UsageUnit.BYTES, 64 * MiB)
        assert code_of(lambda: c.node_get_volume_stats(vid, binds[1])) == (
            grpc.StatusCode.NOT_FOUND
        )
    finally:
        for path in binds:
            subprocess.run(["umount", path], check=True)
    published = ((vid, target, stagings[0]), (other, other_target, stagings[1]))
    for volume_id, path, staging in published:
        c.node_unpublish_volume(volume_id, path)
        c.node_unstage_volume(volume_id, staging)
