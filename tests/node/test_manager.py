"""Covers kubevol.node.manager and kubevol.node.reconciler.

The node volume manager end to end on real mounts: in-tree plugins and a staged plugin.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest

from kubevol.errors import DeviceStillMountedError, TransientOperationError, UncertainProgressError
from kubevol.node import poddirs
from kubevol.node import reconciler as reconciler_module
from kubevol.node.desired import desired_pod
from kubevol.node.errors import VolumeInUseError
from kubevol.node.executor import OperationKey, OperationKind
from kubevol.node.exporter import AgentMetrics
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import Manifests, manifest_pod_uid
from kubevol.node.owners import Ownership
from kubevol.node.state import AttachedVolume, MountState, VolumeMode
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.node.conftest import NodeEnv
from tests.node.fakes import PLUGIN_NAME, claim_manifest, local_pv_manifest, pod_manifest

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


def manifests(*objects: dict[str, Any]) -> Manifests:
    pods = tuple(o for o in objects if o["kind"] == "Pod")
    pvs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolume"}
    pvcs = {
        ("default", o["metadata"]["name"]): o
        for o in objects
        if o["kind"] == "PersistentVolumeClaim"
    }
    return Manifests(pods=pods, pvs=pvs, pvcs=pvcs)


def staged_pod(name: str, pv: str) -> dict[str, Any]:
    claim = {"name": "data", "persistentVolumeClaim": {"claimName": f"{pv}-claim"}}
    return pod_manifest(name, [claim])


def add(
    manager: NodeVolumeManager, env: NodeEnv, pod: dict[str, Any], *extra: dict[str, Any]
) -> str:
    m = manifests(pod, *extra)
    manager.set_pod(desired_pod(manager.mgr, pod, m))
    return manifest_pod_uid(pod)


def make_manager(env: NodeEnv, **kwargs: Any) -> NodeVolumeManager:
    kwargs.setdefault("workers", 4)
    kwargs.setdefault("initial_backoff", 0.01)
    return NodeVolumeManager(env.host, env.mgr, **kwargs)


def test_in_tree_volumes_set_up_and_torn_down(env: NodeEnv) -> None:
    """emptyDir (disk and Memory) and hostPath come up, then go without leaving anything."""
    host_dir = env.tmp / "host-data"
    pod = pod_manifest(
        "web",
        [
            {"name": "scratch", "emptyDir": {}},
            {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
            {"name": "logs", "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}},
        ],
    )
    manager = make_manager(env)
    uid = add(manager, env, pod)
    result = manager.sync(timeout=20)
    assert result.converged, result
    pod_vols = env.root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir"
    assert (pod_vols / "scratch").is_dir()
    assert mounts_under(env.root) == [str(pod_vols / "cache")]
    (pod_vols / "scratch" / "f").write_text("x")
    (host_dir / "keep").write_text("host data")
    states = {p.spec_name: p.state for p in manager.actual.mounted_volumes()}
    assert states == {"scratch": MountState.MOUNTED, "cache": MountState.MOUNTED,
                      "logs": MountState.MOUNTED}

    manager.remove_pod(uid)
    result = manager.sync(timeout=20)
    assert result.converged, result
    assert mounts_under(env.tmp) == []
    assert not (env.root / "pods" / uid).exists()
    assert (host_dir / "keep").read_text() == "host data"
    assert manager.actual.volumes() == []
    manager.close()


def test_shared_device_is_staged_once_and_unstaged_after_last_pod(env: NodeEnv) -> None:
    """Two pods of one volume: one device mount; it goes only after both pods went."""
    src = env.source("pv1")
    (src / "data.txt").write_text("hello")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    manager = make_manager(env)
    uid_a = add(manager, env, staged_pod("a", "pv1"), pv, pvc)
    uid_b = add(manager, env, staged_pod("b", "pv1"), pv, pvc)
    assert manager.sync(timeout=20).converged
    staged = env.root / "plugins" / "example.com" / "staged" / "mounts" / "pv1"
    pod_a = env.root / "pods" / uid_a / "volumes" / "example.com~staged" / "pv1"
    pod_b = env.root / "pods" / uid_b / "volumes" / "example.com~staged" / "pv1"
    assert sorted(mounts_under(env.root)) == sorted(map(str, [staged, pod_a, pod_b]))
    assert (pod_b / "data.txt").read_text() == "hello"
    assert env.staged.attached() == {"pv1"}
    assert env.staged.faults.calls.count("mount_device") == 1

    manager.remove_pod(uid_a)
    assert manager.sync(timeout=20).converged
    assert sorted(mounts_under(env.root)) == sorted(map(str, [staged, pod_b]))
    assert env.staged.attached() == {"pv1"}

    manager.remove_pod(uid_b)
    assert manager.sync(timeout=20).converged
    assert mounts_under(env.root) == []
    assert env.staged.attached() == set()
    assert (src / "data.txt").read_text() == "hello"
    assert env.staged.faults.calls.count("unmount_device") == 1
    manager.close()


def test_restart_keeps_device_of_a_pod_still_running(env: NodeEnv) -> None:
    """After a crash, reconstruction rebuilds both pods; removing one keeps the device for
    the other (Nomad issue 25813: an in-memory count lost on restart unstages it)."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    first = make_manager(env)
    uid_a = add(first, env, staged_pod("a", "pv1"), pv, pvc)
    uid_b = add(first, env, staged_pod("b", "pv1"), pv, pvc)
    assert first.sync(timeout=20).converged
    first.close()  # the crash: memory is gone, mounts stay

    mgr, staged_plugin = env.fresh_mgr()
    second = NodeVolumeManager(env.host, mgr, workers=4, initial_backoff=0.01)
    # Only pod b is still wanted after the restart.
    pod_b = staged_pod("b", "pv1")
    second.set_pod(desired_pod(mgr, pod_b, manifests(pod_b, pv, pvc)))
    rebuilt = second.reconstruct()
    assert {(f.dir.pod_uid, f.mount.value) for f in rebuilt.volumes} == {
        (uid_a, "mounted"), (uid_b, "mounted"),
    }
    assert all(p.state is MountState.UNCERTAIN for p in second.actual.mounted_volumes())
    result = second.sync(timeout=20)
    assert result.converged, result
    staged = env.root / "plugins" / "example.com" / "staged" / "mounts" / "pv1"
    mount_b = env.root / "pods" / uid_b / "volumes" / "example.com~staged" / "pv1"
    assert sorted(mounts_under(env.root)) == sorted([str(staged), str(mount_b)])
    assert "unmount_device" not in staged_plugin.faults.calls
    (mount_b / "written-after-restart").write_text("ok")
    assert (src / "written-after-restart").read_text() == "ok"
    second.remove_pod(uid_b)
    assert second.sync(timeout=20).converged
    assert mounts_under(env.root) == []
    second.close()


def test_device_unmount_refused_while_disk_shows_a_user(env: NodeEnv) -> None:
    """A manager that lost its count (no pod in memory) still refuses to unstage a device
    whose pod mount is on disk."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    first = make_manager(env)
    uid = add(first, env, staged_pod("a", "pv1"), pv, pvc)
    assert first.sync(timeout=20).converged
    volume = first.actual.volumes()[0]
    first.close()

    second = make_manager(env)
    # Memory says: the volume is staged and no pod uses it.
    lost: AttachedVolume = attrs.evolve(volume, pods=())
    second.actual.merge([lost])
    second.sync(timeout=2)
    [failure] = second.executor.failures()
    assert isinstance(failure.error, VolumeInUseError)
    pod_mount = env.root / "pods" / uid / "volumes" / "example.com~staged" / "pv1"
    assert failure.error.users == (str(pod_mount),)
    staged = env.root / "plugins" / "example.com" / "staged" / "mounts" / "pv1"
    assert str(staged) in mounts_under(env.root)
    assert "unmount_device" not in env.staged.faults.calls
    second.close()


def test_foreign_mount_blocks_unstage_until_it_goes(env: NodeEnv) -> None:
    """A bind of the staged device outside the kubelet root is a counted reference."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    manager = make_manager(env)
    uid = add(manager, env, staged_pod("a", "pv1"), pv, pvc)
    assert manager.sync(timeout=20).converged
    staged = env.root / "plugins" / "example.com" / "staged" / "mounts" / "pv1"
    foreign = env.tmp / "foreign"
    foreign.mkdir()
    os.system(f"mount --bind {staged} {foreign}")
    manager.remove_pod(uid)
    result = manager.sync(timeout=2)
    assert not result.converged
    assert any(isinstance(f.error, DeviceStillMountedError) for f in result.failures)
    assert str(staged) in mounts_under(env.root)
    os.system(f"umount {foreign}")
    result = manager.sync(timeout=20)
    assert result.converged, result
    assert mounts_under(env.tmp) == []
    manager.close()


def test_uncertain_set_up_is_torn_down_when_pod_goes(env: NodeEnv) -> None:
    """A set-up that mounted and then failed uncertainly is marked uncertain and undone."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    manager = make_manager(env, initial_backoff=60.0)
    env.staged.faults.set("set_up", UncertainProgressError("timed out"), after=True)
    uid = add(manager, env, staged_pod("a", "pv1"), pv, pvc)
    result = manager.sync(timeout=1)
    assert not result.converged
    [pod] = manager.actual.mounted_volumes()
    assert pod.state is MountState.UNCERTAIN
    pod_mount = env.root / "pods" / uid / "volumes" / "example.com~staged" / "pv1"
    assert str(pod_mount) in mounts_under(env.root)
    manager.remove_pod(uid)
    result = manager.sync(timeout=20)
    assert result.converged, result
    assert mounts_under(env.root) == []
    manager.close()


def test_uncertain_device_mount_is_unmounted_when_unwanted(env: NodeEnv) -> None:
    """A device mount that failed uncertainly is unmounted once no pod wants it."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    manager = make_manager(env, initial_backoff=60.0)
    env.staged.faults.set("mount_device", UncertainProgressError("lost reply"), after=True)
    uid = add(manager, env, staged_pod("a", "pv1"), pv, pvc)
    manager.sync(timeout=1)
    [volume] = manager.actual.volumes()
    assert volume.device_state is MountState.UNCERTAIN
    manager.remove_pod(uid)
    assert manager.sync(timeout=20).converged
    assert mounts_under(env.root) == []
    assert env.staged.attached() == set()
    manager.close()


def test_transient_failure_is_retried_after_backoff(env: NodeEnv) -> None:
    """A transient error changes nothing; the operation is retried and succeeds."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    manager = make_manager(env, initial_backoff=0.05)
    env.staged.faults.set("attach", TransientOperationError("API busy"))
    uid = add(manager, env, staged_pod("a", "pv1"), pv, pvc)
    result = manager.sync(timeout=20)
    assert result.converged, result
    assert env.staged.faults.calls.count("attach") == 2
    manager.remove_pod(uid)
    assert manager.sync(timeout=20).converged
    manager.close()


def test_final_error_stops_sync_early(env: NodeEnv) -> None:
    """Only final errors left: sync gives up at once and reports them."""
    path = env.tmp / "a-directory"
    path.mkdir()
    pod = pod_manifest("p", [{"name": "f", "hostPath": {"path": str(path), "type": "File"}}])
    manager = make_manager(env)
    add(manager, env, pod)
    result = manager.sync(timeout=60, give_up_after=0.5)
    assert result.stuck and not result.converged
    [failure] = result.failures
    assert "is not a regular file" in str(failure.error)
    assert result.pending and "not set up" in result.pending[0]
    manager.close()


def test_pods_not_owned_are_left_alone(env: NodeEnv) -> None:
    """Pods found on disk that the ownership model does not give the manager keep their
    volumes."""
    pod = pod_manifest("web", [{"name": "cache", "emptyDir": {"medium": "Memory"}}])
    first = make_manager(env)
    add(first, env, pod)
    assert first.sync(timeout=20).converged
    first.close()
    second = make_manager(env, ownership=Ownership(recorded=lambda: {'other'}))
    second.reconstruct()
    assert second.sync(timeout=5).converged
    assert len(mounts_under(env.root)) == 1
    second.close()


@pytest.mark.parametrize("mode", [VolumeMode.FILESYSTEM])
def test_volume_mode_recorded(env: NodeEnv, mode: VolumeMode, tmp_path: Path) -> None:
    """Desired volumes carry the PV's volume mode and size."""
    pv = local_pv_manifest("pv1", str(env.source("pv1")))
    pod = staged_pod("a", "pv1")
    dp = desired_pod(env.mgr, pod, manifests(pod, pv, claim_manifest("pv1")))
    [v] = dp.volumes
    assert v.mode is mode
    assert v.size == 1 << 20
    assert v.plugin_name == PLUGIN_NAME
    assert v.unique_name == f"{PLUGIN_NAME}/pv1"
    assert v.attachable and v.device_mountable


def test_larger_desired_size_expands_on_the_node(env: NodeEnv) -> None:
    """A PV grown in the desired state is expanded on the node once, with both sizes."""
    src = str(env.source("pv1"))
    pvc = claim_manifest("pv1")
    pod = staged_pod("a", "pv1")
    manager = make_manager(env)
    add(manager, env, pod, local_pv_manifest("pv1", src), pvc)
    assert manager.sync(timeout=20).converged
    assert env.staged.expansions == []
    add(manager, env, pod, local_pv_manifest("pv1", src, size="2Mi"), pvc)
    assert manager.sync(timeout=20).converged
    assert env.staged.expansions == [(2 << 20, 1 << 20)]
    assert manager.actual.volumes()[0].size == 2 << 20
    manager.remove_pod(manifest_pod_uid(pod))
    assert manager.sync(timeout=20).converged
    manager.close()


def test_controller_attached_volume_is_waited_for(env: NodeEnv) -> None:
    """Without node attach, the manager waits for someone else to attach the volume."""
    src = str(env.source("pv1"))
    pv, pvc = local_pv_manifest("pv1", src), claim_manifest("pv1")
    pod = staged_pod("a", "pv1")
    manager = make_manager(env, attach_by_node=False)
    add(manager, env, pod, pv, pvc)
    result = manager.sync(timeout=2)
    assert not result.converged
    assert {f.kind.value for f in result.failures} == {"wait-for-attach"}
    assert "attach" not in env.staged.faults.calls
    env.staged.new_attacher().attach(manager.desired.volumes_to_mount()[0].spec, "node-1")
    result = manager.sync(timeout=20)
    assert result.converged, result
    [volume] = manager.actual.volumes()
    assert volume.attach_state is MountState.MOUNTED and volume.device_path == src
    manager.remove_pod(manifest_pod_uid(pod))
    assert manager.sync(timeout=20).converged
    assert env.staged.attached() == {"pv1"}  # detaching is the attacher's (controller's) job
    assert manager.actual.volumes() == []
    manager.close()


def test_a_pod_directory_is_removed_beside_the_pass_and_never_under_a_set_up(
    env: NodeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gone pod's directory is removed by an operation of its own: the pass that starts
    it returns at once, and while it runs the same pod, wanted again, gets no set-up (its
    volume directories would be created under a removal). Once it ended, the pod comes up."""
    pod = pod_manifest("web", [{"name": "scratch", "emptyDir": {}}])
    manager = make_manager(env)
    uid = add(manager, env, pod)
    assert manager.sync(timeout=20).converged
    entered, release = threading.Event(), threading.Event()
    real_remove = poddirs.remove_pod_dir

    def slow_remove(pod_dir: str) -> bool:
        entered.set()
        assert release.wait(20)
        return real_remove(pod_dir)

    monkeypatch.setattr(reconciler_module, "remove_pod_dir", slow_remove)
    try:
        manager.remove_pod(uid)
        # Passes tear the volume down, then start the removal and return while it runs.
        wait_until(lambda: manager.reconcile() >= 0 and entered.is_set(), what="removal")
        assert [k for _, k in manager.executor.pending()] == [OperationKind.REMOVE_POD_DIR]
        add(manager, env, pod)
        for _ in range(3):
            assert manager.reconcile() == 0  # no set-up while the directory goes
        assert [k for _, k in manager.executor.pending()] == [OperationKind.REMOVE_POD_DIR]
    finally:
        release.set()
    manager.executor.wait_idle(20)
    assert manager.sync(timeout=20).converged
    assert (env.root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "scratch").is_dir()
    manager.close()


def test_a_pod_directory_removal_is_no_kubelet_storage_operation_in_the_metrics(
    env: NodeEnv,
) -> None:
    """storage_operation_duration_seconds keeps the kubelet's operation names: kubevol's
    removal of a pod directory is not recorded there; a tear-down is."""
    manager = make_manager(env)
    try:
        metrics = AgentMetrics(manager)
        pod_dir = str(env.root / "pods" / "uid-1")
        metrics.observe(OperationKey(volume=pod_dir), OperationKind.REMOVE_POD_DIR, 0.01, None)
        assert b"remove" not in metrics.exposition()
        metrics.observe(OperationKey(volume="kubernetes.io/empty-dir/uid-1-scratch", pod="uid-1"),
                        OperationKind.TEAR_DOWN, 0.01, None)
        assert b'operation_name="volume_unmount"' in metrics.exposition()
    finally:
        manager.close()


def test_a_restart_with_no_orphan_lists_the_pods_once(
    env: NodeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan lists every pod's volume directories; with no orphan device mount to judge,
    cleaning lists them no second time (a second walk of the pods at every start-up)."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    first = make_manager(env)
    uid = add(first, env, staged_pod("a", "pv1"), pv, pvc)
    assert first.sync(timeout=20).converged
    first.close()
    mgr, _ = env.fresh_mgr()
    second = NodeVolumeManager(env.host, mgr, workers=4, initial_backoff=0.01)
    listed: list[str] = []

    def pods_on_disk() -> set[str]:
        listed.append("listed")
        return set()

    monkeypatch.setattr(second, "pods_on_disk", pods_on_disk)
    pod = staged_pod("a", "pv1")
    second.set_pod(desired_pod(mgr, pod, manifests(pod, pv, pvc)))
    rebuilt = second.reconstruct()
    assert not rebuilt.orphans and listed == []
    second.remove_pod(uid)
    assert second.sync(timeout=20).converged
    assert mounts_under(env.root) == []
    second.close()


def test_a_volume_with_a_device_to_release_is_torn_down_first(
    env: NodeEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod's tear-downs start with the volume whose unstage and detach follow: the
    longest chain of a pod's removal goes first (issue 36, the lone removal)."""
    src = env.source("pv1")
    pv, pvc = local_pv_manifest("pv1", str(src)), claim_manifest("pv1")
    pod = pod_manifest("web", [
        {"name": "scratch", "emptyDir": {}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "pv1-claim"}},
    ])
    manager = make_manager(env)
    uid = add(manager, env, pod, pv, pvc)
    assert manager.sync(timeout=20).converged
    # Whatever order the volumes are listed in (by unique name: a CSI volume's
    # "kubernetes.io/csi/..." comes after a configMap's): here the emptyDir first.
    listed = manager.actual.volumes
    monkeypatch.setattr(manager.actual, "volumes", lambda: sorted(
        listed(), key=lambda v: v.plugin_name != "kubernetes.io/empty-dir"))
    started: list[OperationKind] = []
    plugins: list[str] = []
    run = manager.executor.run

    def noted(key: OperationKey, kind: OperationKind, op: Any) -> Any:
        started.append(kind)
        plugins.append(key.volume.split("/")[0])
        return run(key, kind, op)

    monkeypatch.setattr(manager.executor, "run", noted)
    manager.remove_pod(uid)
    manager.reconcile(full=True)
    assert started[:2] == [OperationKind.TEAR_DOWN] * 2
    assert plugins[:2] == [PLUGIN_NAME.split("/")[0], "kubernetes.io"]
    assert manager.sync(timeout=20).converged
    manager.close()
