"""Covers kubevol.node.reconciler with kubevol.node.owners.

The long-running reconciler obeys the ownership model: over many passes (the agent's
loop, with its follow-up of volumes that could not be rebuilt and its pod directory
clean-up) a pod it does not own keeps every mount, its broken volume and the device mount
that volume led to, even when the caller asks to remove it; a pod it owns goes. And the
last line of defence in the same loop: a pod directory something holds is not removed."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from kubevol.node.manager import NodeVolumeManager
from kubevol.node.owners import Ownership
from kubevol.testing.mount_rig import mounts_under
from tests.node.conftest import NodeEnv
from tests.node.fakes import claim_manifest, local_pv_manifest, pod_manifest
from tests.node.test_reconstruct import set_up, staged_pod

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


def _run_passes(manager: NodeVolumeManager, seconds: float) -> None:
    """Let the agent's loop run for ``seconds`` (many passes: period 20 ms)."""
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(stop,), kwargs={"period": 0.02})
    loop.start()
    stop.wait(seconds)
    stop.set()
    loop.join()
    manager.executor.wait_idle(10)


def test_the_loop_leaves_a_foreign_pod_its_broken_volume_and_orphan_device_mount(
    env: NodeEnv,
) -> None:
    """Manager owns "web" only. "db" (not owned) has a volume whose metadata is broken, so
    its device mount is an orphan: after many passes, and after remove_pod("db"), every
    mount of db is in place, its failure is still pending (never cleaned) and its directory
    is there; web's volume is torn down and its directory removed."""
    pv = local_pv_manifest("pv1", str(env.source("pv1")))
    web_pod = pod_manifest("web", [{"name": "cache", "emptyDir": {"medium": "Memory"}}])
    db, web = set_up(env, staged_pod("db"), web_pod, extra=(pv, claim_manifest("pv1")))
    Path(env.staged.meta_path("pv1")).write_text("{not json")
    db_mounts = [p for p in mounts_under(env.root) if f"/pods/{web}/" not in p]
    assert len(db_mounts) == 2  # db's published volume and its device (staging) mount
    manager = NodeVolumeManager(env.host, env.mgr, workers=2,
                                ownership=Ownership(recorded=lambda: {web}))
    result = manager.reconstruct(clean=True)
    assert [f.dir.pod_uid for f in result.failures] == [db]
    assert result.orphans and all(o.cleanup.kind.value == "left" for o in result.orphans)
    manager.remove_pod(web)
    manager.remove_pod(db)  # asked by mistake: not the manager's to take down
    _run_passes(manager, 1.5)
    assert mounts_under(env.root) == db_mounts
    assert manager.has_failures(db)
    assert os.path.isdir(env.host.get_pod_dir(db))
    assert not os.path.exists(env.host.get_pod_dir(web))
    manager.close()


def test_the_loop_does_not_remove_a_pod_directory_a_process_works_in(
    env: NodeEnv, tmp_path: Path
) -> None:
    """A gone pod's volume is torn down, but its directory stays while a process has its
    working directory there (pending says why, naming the PID); it goes once the process
    exits."""
    [uid] = set_up(env, pod_manifest("web", [{"name": "cache", "emptyDir": {}}]))
    pod_dir = env.host.get_pod_dir(uid)
    os.makedirs(f"{pod_dir}/containers/c")
    sleeper = subprocess.Popen(["sleep", "600"], cwd=f"{pod_dir}/containers/c")
    try:
        manager = NodeVolumeManager(env.host, env.mgr, workers=2)
        manager.reconstruct()
        result = manager.sync(timeout=3)
        assert not result.converged
        [pending] = result.pending
        assert pending.startswith(f"pod {uid}: directory not removed yet (refusing to remove")
        assert f"process {sleeper.pid} (sleep)" in pending
        assert os.path.isdir(f"{pod_dir}/containers/c")
        assert not os.path.exists(f"{pod_dir}/volumes/kubernetes.io~empty-dir/cache")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert manager.sync(timeout=20).converged
    assert not os.path.exists(pod_dir)
    manager.close()
