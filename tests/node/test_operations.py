"""Covers kubevol.node.operations with kubevol.mount.guard.

The node's volume operations against a real CSI driver (the bundled hostpath driver on a
unix socket): the unstage guard is asked once per unmount_device and decides alone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.errors import DeviceStillMountedError
from kubevol.mount import LinuxMounter
from kubevol.mount import guard as guard_module
from kubevol.mount.guard import RefKind, UnmountVerdict
from kubevol.mount.table import MountTable
from kubevol.node.desired import desired_pod
from kubevol.node.errors import VolumeInUseError
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import Manifests
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import AttachedVolume, MountState
from kubevol.testing.mount_rig import MountRig, mounted_at, mounts_under
from tests.csi.support import HostPathServer

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


@pytest.fixture
def hostpath(serve_hostpath: HostPathServer) -> str:
    """The hostpath driver served in this process; its endpoint."""
    return serve_hostpath().endpoint


def _pod_with_volume(handle: str) -> Manifests:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "pod-web-1"},
        "spec": {"containers": [{"name": "c", "image": "x"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c1"}}]},
    }
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "c1", "namespace": "default"}, "spec": {"volumeName": "pv1"}}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
          "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                   "csi": {"driver": DRIVER_NAME, "volumeHandle": handle}}}
    return Manifests(pods=(pod,), pvs={"pv1": pv}, pvcs={("default", "c1"): pvc})


def table_reads(manager: NodeVolumeManager) -> int:
    """How many times the node's one mount table (the host's mounter's) was read."""
    mounter = manager.host.get_mounter()
    assert isinstance(mounter, LinuxMounter)
    return mounter._table.reads


def _device_state(manager: NodeVolumeManager, unique_name: str) -> MountState:
    volume = manager.actual.volume(unique_name)
    assert volume is not None
    return volume.device_state

def _unpublished(manager: NodeVolumeManager) -> tuple[AttachedVolume, str]:
    """Tears down the one pod volume of ``manager`` (unpublish): the volume, still staged,
    and its staging path."""
    [av] = manager.actual.volumes()
    [mounted] = av.pods
    manager.generator.tear_down(av, mounted)()
    assert av.device_mount_path is not None
    return av, av.device_mount_path



class _CountedChecks:
    """Counts the plugin's unstage verdicts and guard runs, keeps the table each guard run
    was given, and fails the test if the guard reads the mount table itself."""

    def __init__(self, runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.verdicts: list[UnmountVerdict] = []
        self.guard_runs: list[str] = []
        self.tables: list[MountTable | None] = []
        ask, check = runtime.csi.device_unmount_verdict, runtime.csi.context.check_unmount

        def counting(path: str, *, table: MountTable | None = None) -> UnmountVerdict:
            self.verdicts.append(ask(path, table=table))
            return self.verdicts[-1]

        def counting_guard(
            path: str, driver: str | None, *, table: MountTable | None = None
        ) -> UnmountVerdict:
            self.guard_runs.append(path)
            self.tables.append(table)
            return check(path, driver, table=table)

        def no_read(*args: object) -> bytes:
            raise AssertionError("the guard read the mount table itself")

        monkeypatch.setattr(runtime.csi, "device_unmount_verdict", counting)
        monkeypatch.setattr(runtime.csi.context, "check_unmount", counting_guard)
        monkeypatch.setattr(guard_module, "read_mountinfo_bytes", no_read)


def test_nested_mount_blocks_unstage_under_safe_with_one_guard_run(
    staged: tuple[NodeRuntime, NodeVolumeManager, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``safe``, a bind mount nested inside the staging path (a sub-directory of the
    volume itself) blocks unmount_device: the plugin's verdict is asked exactly once, the
    device stays staged and its state unchanged; once the nested mount is gone the next
    unmount_device unstages it. The guard judges on the one mount table the operation read
    for its checks: it reads none itself."""
    runtime, manager, root = staged
    av, dmp = _unpublished(manager)
    nested, sub = os.path.join(dmp, "nested"), os.path.join(dmp, "sub")
    os.mkdir(nested)
    os.mkdir(sub)
    subprocess.run(["mount", "--bind", sub, nested], check=True)

    checks = _CountedChecks(runtime, monkeypatch)
    reads = table_reads(manager)

    with pytest.raises(DeviceStillMountedError) as err:
        manager.generator.unmount_device(av)()
    assert err.value.refs == (nested,)
    assert len(checks.guard_runs) == len(checks.verdicts) == 1
    table = checks.tables[0]
    assert table is not None and table.find_mount_point(nested) is not None
    assert table_reads(manager) == reads + 1  # one read for both checks
    [ref] = checks.verdicts[0].refs
    assert (ref.mount_point, ref.kind, ref.blocking) == (nested, RefKind.SAME_VOLUME, True)
    assert dmp in mounts_under(root)
    assert _device_state(manager, av.unique_name) is MountState.MOUNTED

    subprocess.run(["umount", nested], check=True)
    manager.generator.unmount_device(av)()
    # Only a detach since the first read: the guard judges first on that table, which
    # still lists the nested mount, and its refusal is confirmed on a fresh read, which
    # allows the unmount.
    assert len(checks.guard_runs) == len(checks.verdicts) == 3
    assert checks.tables[1] is table
    fresh = checks.tables[2]
    assert fresh is not None and fresh.find_mount_point(nested) is None
    assert table_reads(manager) == reads + 2
    assert mounts_under(root) == []
    assert _device_state(manager, av.unique_name) is MountState.UNMOUNTED


@pytest.fixture
def staged(
    tmp_path: Path, hostpath: str
) -> Iterator[tuple[NodeRuntime, NodeVolumeManager, Path]]:
    """A hostpath volume staged and published for one pod under ``tmp_path/root`` (with
    the ``safe`` guard); the runtime, the manager and the root."""
    yield from _staged(tmp_path, hostpath)


@pytest.fixture
def staged_attached(tmp_path: Path) -> Iterator[tuple[NodeRuntime, NodeVolumeManager, Path]]:
    """:func:`staged`, with a hostpath driver that attaches (PUBLISH_UNPUBLISH_VOLUME): the
    node published the volume to itself before staging it."""
    config = HostPathConfig(state_dir=str(tmp_path / "hp-attach"), node_id="n1",
                            enable_attach=True)
    running = HostPathDriver(config).serve()
    try:
        yield from _staged(tmp_path, running.endpoint)
    finally:
        running.stop(grace=2)


def _staged(
    tmp_path: Path, hostpath: str
) -> Iterator[tuple[NodeRuntime, NodeVolumeManager, Path]]:
    with CSIClient(hostpath, timeout=30) as client:
        handle = client.create_volume(
            "vol1", [t.VolumeCapability.mount()],
            capacity_range=t.CapacityRange(required_bytes=16 << 20),
        ).volume_id
    root = tmp_path / "root"
    with NodeRuntime(str(root), node_name="node-1", csi_drivers={DRIVER_NAME: hostpath},
                     guard_policy="safe") as runtime:
        manager = NodeVolumeManager(runtime.host, runtime.mgr, workers=0)
        try:
            manifests = _pod_with_volume(handle)
            manager.set_pod(desired_pod(runtime.mgr, manifests.pods[0], manifests))
            assert manager.sync(timeout=30).converged
            yield runtime, manager, root
            manager.remove_pod("pod-web-1")  # whatever the test left: down, unstaged
            assert manager.sync(timeout=30).converged
        finally:
            manager.close()
    with CSIClient(hostpath, timeout=30) as client:
        client.delete_volume(handle)


def test_a_table_read_before_the_pod_was_torn_down_does_not_block_its_unstage(
    staged: tuple[NodeRuntime, NodeVolumeManager, Path],
) -> None:
    """The checks read the table while the pod's mount was there; the tear-down detached
    it (the driver's unmount) and removed its directory, so the table kept for the checks
    leaves it out: the unstage judges on that table without reading the table again."""
    _, manager, root = staged
    [av] = manager.actual.volumes()
    [mounted] = av.pods
    before = manager.usage.table(superset=True)
    assert before.find_mount_point(mounted.path) is not None
    reads = table_reads(manager)
    manager.generator.tear_down(av, mounted)()
    after = manager.usage.table(superset=True)  # a detach only: kept, not read
    assert after.derived_from == (before, frozenset({mounted.path}))
    assert after.find_mount_point(mounted.path) is None
    assert table_reads(manager) == reads

    manager.generator.unmount_device(av)()
    assert table_reads(manager) == reads
    assert mounts_under(root) == []
    assert _device_state(manager, av.unique_name) is MountState.UNMOUNTED


def test_a_mount_attached_after_the_last_read_blocks_the_unstage(
    staged: tuple[NodeRuntime, NodeVolumeManager, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reference to the volume mounted after the table was read (a bind of a
    sub-directory of the staged volume) is not missed: an attach since the read means the
    table is read again, and the guard refuses on what it finds."""
    runtime, manager, root = staged
    av, dmp = _unpublished(manager)
    manager.usage.table(superset=True)  # read after the tear-down: no pod mount in it
    sub, nested = os.path.join(dmp, "sub"), os.path.join(dmp, "nested")
    os.mkdir(sub)
    os.mkdir(nested)
    subprocess.run(["mount", "--bind", sub, nested], check=True)
    checks = _CountedChecks(runtime, monkeypatch)

    with pytest.raises(DeviceStillMountedError) as err:
        manager.generator.unmount_device(av)()
    assert err.value.refs == (nested,)
    [table] = checks.tables
    assert table is not None and table.find_mount_point(nested) is not None
    assert dmp in mounts_under(root)
    subprocess.run(["umount", nested], check=True)
    manager.generator.unmount_device(av)()
    assert mounts_under(root) == []


def test_a_staging_mount_detached_by_someone_else_is_judged_on_a_fresh_table(
    staged: tuple[NodeRuntime, NodeVolumeManager, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone unmounted the staging path after the table was read: the table still has a
    mount there, but not the one the path is on now, so the guard judges on a fresh read
    (which mount holds the path decides what the guard looks for)."""
    runtime, manager, root = staged
    av, dmp = _unpublished(manager)
    stale = manager.usage.table(superset=True)
    subprocess.run(["umount", dmp], check=True)
    checks = _CountedChecks(runtime, monkeypatch)

    manager.generator.unmount_device(av)()
    [table] = checks.tables
    assert table is not stale and table is not None
    assert stale.find_mount_point(dmp) is not None and table.find_mount_point(dmp) is None
    assert mounts_under(root) == []


def _unstaged(manager: NodeVolumeManager) -> AttachedVolume:
    """The one volume of ``manager`` torn down for its pod and unstaged: what is left is
    its detach."""
    av, _ = _unpublished(manager)
    manager.generator.unmount_device(av)()
    unstaged = manager.actual.volume(av.unique_name)
    assert unstaged is not None and unstaged.device_state is MountState.UNMOUNTED
    return unstaged


def _pods_on_disk_use_it(manager: NodeVolumeManager, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the disk answer that a pod uses any volume; the volumes it was asked about."""
    asked: list[str] = []

    def users(unique_name: str, *args: object, **kwargs: object) -> list[str]:
        asked.append(unique_name)
        return ["/var/lib/kubelet/pods/other/volumes/kubernetes.io~csi/pv1/mount"]

    monkeypatch.setattr(manager.usage, "users", users)
    return asked


def test_a_detach_that_detaches_nothing_only_forgets_the_volume(
    staged: tuple[NodeRuntime, NodeVolumeManager, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hostpath driver does not attach (no PUBLISH_UNPUBLISH_VOLUME): its volumes'
    detach does nothing, so the node forgets the volume without asking the disk whether
    pods use it (the kubelet marks a volume it does not detach detached, no check)."""
    _, manager, _ = staged
    av = _unstaged(manager)
    asked = _pods_on_disk_use_it(manager, monkeypatch)
    manager.generator.detach(av)()
    assert asked == []
    assert manager.actual.volume(av.unique_name) is None


def test_a_detach_that_detaches_is_refused_while_pods_on_disk_use_the_volume(
    staged_attached: tuple[NodeRuntime, NodeVolumeManager, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver that attaches: its detach (ControllerUnpublishVolume) waits until the disk
    shows no pod using the volume."""
    _, manager, _ = staged_attached
    av = _unstaged(manager)
    assert av.attach_state is MountState.MOUNTED
    asked = _pods_on_disk_use_it(manager, monkeypatch)
    with pytest.raises(VolumeInUseError):
        manager.generator.detach(av)()
    assert asked and set(asked) == {av.unique_name}  # read again to confirm the refusal
    assert manager.actual.volume(av.unique_name) is not None
    monkeypatch.undo()
    manager.generator.detach(av)()
    assert manager.actual.volume(av.unique_name) is None


def test_a_dead_mount_a_tear_down_left_behind_is_unmounted(
    staged: tuple[NodeRuntime, NodeVolumeManager, Path], rig: MountRig
) -> None:
    """A plugin's tear-down that returned with a dead FUSE mount at the pod volume's path
    (stat answers ENOTCONN, not "no such file"): the operation unmounts it."""
    _, manager, root = staged
    dead = rig.corrupted(root / "pods" / "pod-fuse-1" / "volumes" / "example.com~fuse" / "v")
    manager.generator._finish_tear_down(str(dead))
    assert not mounted_at(dead)


def test_a_path_the_tear_down_removed_is_not_resolved(
    staged: tuple[NodeRuntime, NodeVolumeManager, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gone is gone: no mount can be there, and no dozen-lookup realpath is spent on it."""
    _, manager, root = staged

    def no_realpath(path: str) -> str:
        raise AssertionError(f"resolved {path}")

    monkeypatch.setattr(os.path, "realpath", no_realpath)
    manager.generator._finish_tear_down(str(root / "pods" / "pod-web-1" / "volumes" / "x" / "y"))
    monkeypatch.undo()
