"""Covers kubevol.node.agent and kubevol.node.exporter beside a dead mount.

The agent beside a volume that stopped answering (issue 29): a frozen FUSE daemon over a
running pod's CSI volume costs that claim only. Its stats are reported abnormal and not
measured again while one measurement is stuck, /healthz and /metrics answer promptly, and a
new pod is set up."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable

from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.node.test_agent import (  # noqa: F401  (fixtures)
    AgentEnv,
    RunningAgent,
    env,
    pod,
    pv,
    start_agent,
)

ABNORMAL = "kubelet_volume_stats_health_status_abnormal"


def test_a_hung_claim_is_abnormal_and_the_agent_goes_on(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]  # noqa: F811
) -> None:
    """With the web pod's CSI mount under a SIGSTOPped bindfs: within a measurement period
    plus the probe's deadline its claim reads abnormal; /healthz and /metrics answer in under
    a second; a new pod's volume is mounted; the hung mount is left in place."""
    running = start_agent(stats_period=0.2)
    running.agent.runtime.host.probe.timeout = 1.0
    handle = env.create_volume("web-data")
    (env.manifests / "web.yaml").write_text(pv("pv-web", handle) + pod(
        "web", "  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}\n"))
    mount = env.pod_volume("web", "pv-web") + "/mount"
    wait_until(lambda: mount in mounts_under(env.root), 30, "the CSI mount")
    labels = (("namespace", "shop"), ("persistentvolumeclaim", "pv-web-claim"))
    wait_until(lambda: running.scrape().get((ABNORMAL, labels)) == 0, 30, "a measurement")

    (env.tmp / "src").mkdir()
    bindfs = subprocess.Popen(["bindfs", "-f", str(env.tmp / "src"), mount])
    try:
        wait_until(lambda: bool(_fuse_over(mount)), 10, "bindfs")
        bindfs.send_signal(signal.SIGSTOP)
        wait_until(lambda: running.scrape().get((ABNORMAL, labels)) == 1, 15,
                   "the hung claim reported abnormal")
        started = time.monotonic()
        with urllib.request.urlopen(running.url("/healthz"), timeout=5) as resp:
            assert resp.status == 200
        running.scrape()
        assert time.monotonic() - started < 1.0

        db = env.create_volume("db-data")
        (env.manifests / "db.yaml").write_text(pv("pv-db", db) + pod(
            "db", "  - {name: data, persistentVolumeClaim: {claimName: pv-db-claim}}\n"))
        db_mount = env.pod_volume("db", "pv-db") + "/mount"
        wait_until(lambda: db_mount in mounts_under(env.root), 30, "the new pod's mount")
        assert _fuse_over(mount), "the hung mount was touched"
    finally:
        bindfs.kill()
        bindfs.wait()
        subprocess.run(["umount", "-l", mount], check=False)


def _fuse_over(path: str) -> list[str]:
    """The FUSE mount points at ``path`` in this namespace's table."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line for line in f if f" {path} " in line and " - fuse" in line]
