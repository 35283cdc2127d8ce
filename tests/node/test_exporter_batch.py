"""Covers kubevol.node.exporter's VolumeStats with CSI claims: every claim's
NodeGetVolumeStats is sent at once and waited for under one deadline of the host's probe,
so a driver that stops answering costs a refresh one deadline, not one per claim. The
claims it leaves stuck are reported abnormal and not asked again until the calls end.
The bundled hostpath driver answers over gRPC, on real mounts and a loop device."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.node.agent import Agent
from kubevol.node.exporter import ClaimStats
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.mount_rig import mounts_under, unmount_all_under
from kubevol.testing.waiting import wait_until
from tests.node.test_agent import UIDS, AgentEnv, AgentThreads, pod, pv


class GatedStats:
    """The hostpath driver's NodeGetVolumeStats, held while ``open`` is clear; counted."""

    def __init__(self, node: Any) -> None:
        self.open = threading.Event()
        self.open.set()
        self.calls = 0
        self._lock = threading.Lock()
        real = node.node_get_volume_stats

        def gated(request: Any, context: Any) -> Any:
            with self._lock:
                self.calls += 1
            self.open.wait(60)
            return real(request, context)

        node.node_get_volume_stats = gated


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[AgentEnv, GatedStats]]:
    if os.geteuid() != 0:
        pytest.fail("the agent tests need root (real mounts, loop devices)")
    (tmp_path / "hp").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(tmp_path / "hp")],
                   check=True)
    (tmp_path / "manifests").mkdir()
    driver = HostPathDriver(HostPathConfig(state_dir=str(tmp_path / "hp"), node_id="n1"))
    stats = GatedStats(driver.plugin.node)
    running = driver.serve()
    try:
        yield AgentEnv(tmp=tmp_path, root=tmp_path / "root", manifests=tmp_path / "manifests",
                       driver=running), stats
    finally:
        stats.open.set()
        running.stop()
        unmount_all_under(tmp_path)


def by_claim(stats: tuple[ClaimStats, ...]) -> dict[str, ClaimStats]:
    return {s.claim: s for s in stats}


@pytest.mark.root
def test_a_driver_that_stops_answering_costs_a_refresh_one_deadline(
    gated: tuple[AgentEnv, GatedStats],
) -> None:
    """Three claims (two filesystems, one block) on a driver whose NodeGetVolumeStats
    hangs: the refresh takes one probe deadline, not three, and reports all three abnormal;
    the next refresh does not ask the driver again while the calls are stuck; once the
    driver answers, the claims have figures again."""
    env, stats = gated
    threads = AgentThreads()
    runtime = NodeRuntime(str(env.root), node_name="n1",
                          csi_drivers={DRIVER_NAME: env.driver.endpoint})
    # Refreshed by the test only: the agent's own first refresh (once it settled) is waited
    # for before any pod exists, and the next is an hour away.
    agent = Agent(runtime, manifest_dir=str(env.manifests), stats_period=3600)
    try:
        threads.run(agent, runtime)
        wait_until(lambda: agent.metrics.stats.refreshed is not None, 10,
                   "the agent's own first refresh")
        claims = {"web": "pv-web", "db": "pv-db"}
        manifests = "".join(
            pv(volume, env.create_volume(f"{volume}-data")) + pod(
                name, f"  - {{name: data, persistentVolumeClaim: {{claimName: {volume}-claim}}}}\n")
            for name, volume in claims.items())
        manifests += pv("pv-raw", env.create_volume("raw-disk", block=True), block=True) + pod(
            "raw", "  - {name: disk, persistentVolumeClaim: {claimName: pv-raw-claim}}\n",
            "[{name: c, image: x, volumeDevices: [{name: disk, devicePath: /dev/xvda}]}]")
        (env.manifests / "pods.yaml").write_text(manifests)
        mounts = [env.pod_volume(name, volume) + "/mount" for name, volume in claims.items()]
        link = f"{env.root}/pods/{UIDS['raw']}/volumeDevices/kubernetes.io~csi/pv-raw"
        wait_until(lambda: set(mounts) <= set(mounts_under(env.root))
                   and os.path.lexists(link), 30, "the three volumes")
        wanted = {"pv-web-claim", "pv-db-claim", "pv-raw-claim"}
        volume_stats = agent.metrics.stats
        volume_stats.refresh()
        first = by_claim(volume_stats.snapshot())
        assert set(first) == wanted
        assert all(s.abnormal is False and s.capacity == 16 << 20 for s in first.values())

        probe = runtime.host.probe
        probe.timeout = 1.0  # three deadlines (3 s) far from one under any load
        stats.open.clear()
        asked = stats.calls
        started = time.monotonic()
        volume_stats.refresh()
        took = time.monotonic() - started
        assert took < 2.0, f"three stuck claims took {took:.2f}s (one deadline is 1s)"
        hung = by_claim(volume_stats.snapshot())
        assert set(hung) == wanted
        assert all(s.abnormal is True and s.capacity is None for s in hung.values())
        wait_until(lambda: stats.calls >= asked + 3, 10, "the three calls at the driver")
        assert stats.calls == asked + 3

        started = time.monotonic()
        volume_stats.refresh()
        assert time.monotonic() - started < 0.6  # no deadline waited (1 s)
        assert all(s.abnormal is True for s in volume_stats.snapshot())
        time.sleep(0.2)  # a call the refresh sent would reach the gate by now
        assert stats.calls == asked + 3, "a stuck claim was asked again"

        stats.open.set()
        wait_until(lambda: probe.stuck() == {}, 10, "the stuck calls answered")
        volume_stats.refresh()
        again = by_claim(volume_stats.snapshot())
        assert {n: (s.abnormal, s.capacity) for n, s in again.items()} == dict.fromkeys(
            wanted, (False, 16 << 20))
    finally:
        stats.open.set()
        threads.stop_all()
