"""Covers kubevol.node.exporter: the agent's /metrics.

The agent's /metrics as Prometheus reads it, against the kubelet's volume stats
collector (``pkg/kubelet/metrics/collectors/volume_stats.go``): each claim once however many
pods use it, and block-mode CSI claims under the same gauges (kubernetes#97972), measured
by NodeGetVolumeStats at the kubelet's block path, ``volumeDevices/<pv>/dev/<pod uid>``.
The bundled hostpath driver answers over gRPC, on real mounts and loop devices."""

from __future__ import annotations

import os
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.node.agent import Agent
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.node.hostpath_calls import MiB, RecordedHostPath, device_size, recorded_hostpath
from tests.node.test_agent import UIDS, AgentThreads, pod, pv

STATS = "node_get_volume_stats"
GAUGES = (
    "kubelet_volume_stats_capacity_bytes",
    "kubelet_volume_stats_available_bytes",
    "kubelet_volume_stats_used_bytes",
    "kubelet_volume_stats_inodes",
    "kubelet_volume_stats_inodes_free",
    "kubelet_volume_stats_inodes_used",
    "kubelet_volume_stats_health_status_abnormal",
)
Series = tuple[str, tuple[tuple[str, str], ...]]


def series(agent: Agent) -> list[tuple[Series, float]]:
    """Every sample of a scrape of ``/metrics`` as Prometheus' text parser reads it, in
    order, duplicates kept (a dict would hide them, as Prometheus silently does)."""
    assert agent.server is not None
    with urllib.request.urlopen(f"http://{agent.server.address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return [
        ((s.name, tuple(sorted(s.labels.items()))), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def claim(name: str) -> tuple[tuple[str, str], ...]:
    return (("namespace", "shop"), ("persistentvolumeclaim", name))


@pytest.fixture
def hostpath(tmp_path: Path) -> Iterator[RecordedHostPath]:
    """The hostpath driver on a tmpfs of its own, NodeGetVolumeStats recorded."""
    if os.geteuid() != 0:
        pytest.fail("the agent tests need root (real mounts, loop devices)")
    with recorded_hostpath(tmp_path, (STATS,)) as driver:
        yield driver


@pytest.fixture
def run_agent(tmp_path: Path, hostpath: RecordedHostPath) -> Iterator[Callable[[], Agent]]:
    """Start an agent on ``tmp_path/root`` reading ``tmp_path/manifests``, its volume stats
    refreshed every 0.2 s."""
    threads = AgentThreads()
    (tmp_path / "manifests").mkdir()

    def start() -> Agent:
        runtime = NodeRuntime(str(tmp_path / "root"), node_name="n1",
                              csi_drivers={DRIVER_NAME: hostpath.endpoint})
        agent = Agent(runtime, manifest_dir=str(tmp_path / "manifests"),
                      metrics_address="127.0.0.1:0", stats_period=0.2)
        threads.run(agent, runtime)
        return agent

    yield start
    threads.stop_all()


@pytest.mark.root
def test_a_claim_two_pods_share_is_exported_once(
    tmp_path: Path, hostpath: RecordedHostPath, run_agent: Callable[[], Agent]
) -> None:
    """Two running pods mounting claim pv-web-claim give each kubelet_volume_stats_* series
    once (the collector skips a claim it collected), and no series of the scrape repeats."""
    root = tmp_path / "root"
    handle = hostpath.create_volume("shared", 16 * MiB)
    volumes = "  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}\n"
    (tmp_path / "manifests" / "pods.yaml").write_text(
        pv("pv-web", handle) + pod("web", volumes) + pod("db", volumes)
    )
    agent = run_agent()
    mounts = [
        f"{root}/pods/{UIDS[name]}/volumes/kubernetes.io~csi/pv-web/mount" for name in ("web", "db")
    ]
    wait_until(lambda: set(mounts) <= set(mounts_under(root)), 30, "both pods' mounts")
    labels = claim("pv-web-claim")
    # Two refreshes more: the second began after both pods were set up.
    asked = len(hostpath.calls(STATS))
    wait_until(lambda: len(hostpath.calls(STATS)) >= asked + 2, 30, "two refreshes")
    samples = series(agent)
    repeated = [k for k, n in Counter(k for k, _ in samples).items() if n > 1]
    assert repeated == []
    ours = [(k[0], v) for k, v in samples if k[1] == labels]
    assert sorted(name for name, _ in ours) == sorted(GAUGES)
    assert dict(ours)["kubelet_volume_stats_capacity_bytes"] == 16 * MiB


@pytest.mark.root
def test_a_block_claim_has_volume_stats_from_its_device(
    tmp_path: Path, hostpath: RecordedHostPath, run_agent: Callable[[], Agent]
) -> None:
    """A block-mode CSI claim is exported under the same gauges: capacity is the device's
    size, the figures the driver leaves out read 0, and the driver was asked at the
    kubelet's block path (the pod's bind under the global map path)."""
    root = tmp_path / "root"
    handle = hostpath.create_volume("raw-disk", 16 * MiB, block=True)
    (tmp_path / "manifests" / "raw.yaml").write_text(pv("pv-raw", handle, block=True) + pod(
        "raw", "  - {name: disk, persistentVolumeClaim: {claimName: pv-raw-claim}}\n",
        "[{name: c, image: x, volumeDevices: [{name: disk, devicePath: /dev/xvda}]}]"))
    agent = run_agent()
    labels = claim("pv-raw-claim")

    def exported() -> dict[str, float]:
        return {k[0]: v for k, v in series(agent) if k[1] == labels}

    wait_until(lambda: "kubelet_volume_stats_capacity_bytes" in exported(), 30, "block stats")
    link = f"{root}/pods/{UIDS['raw']}/volumeDevices/kubernetes.io~csi/pv-raw"
    assert exported() == {
        "kubelet_volume_stats_capacity_bytes": device_size(link),
        "kubelet_volume_stats_available_bytes": 0,
        "kubelet_volume_stats_used_bytes": 0,
        "kubelet_volume_stats_inodes": 0,
        "kubelet_volume_stats_inodes_free": 0,
        "kubelet_volume_stats_inodes_used": 0,
        "kubelet_volume_stats_health_status_abnormal": 0,
    }
    assert device_size(link) == 16 * MiB
    block_path = f"{root}/plugins/kubernetes.io/csi/volumeDevices/pv-raw/dev/{UIDS['raw']}"
    assert {(r.volume_id, r.volume_path) for r in hostpath.calls(STATS)} == {(handle, block_path)}
