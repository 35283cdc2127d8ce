"""A hung volume costs the agent that volume only (issue 29): the latency of new pods,
manifest to all volumes mounted, with one running pod's CSI mount under a frozen FUSE daemon,
against the same run without it.

Usage (as root: real bind mounts and a FUSE mount; needs ``bindfs``)::

    unshare -m --propagation private .venv/bin/python benchmarks/hung_mount.py \\
        [--present 20] [--rounds 8] [--per-round 5]

The bundled hostpath driver and the agent run in this process, as in
``benchmarks/agent.py``, with the volume-stats refresh every second (so the hung claim is
asked about all the time, not once a minute). ``--present`` pods (an emptyDir and a CSI
volume each) run throughout; the first one's CSI mount is covered by a ``bindfs`` mount
that is frozen (SIGSTOP) in odd rounds and thawed (SIGCONT) in even ones, so both sides
are measured in the same run, interleaved. Each round drops ``--per-round`` new pods one
after the other, each timed from the manifest's rename into the watched directory until
both of its volumes are mounted, then removes them. The reference is the healthy rounds;
the target is the hung rounds' median within 20% of theirs. Exits 1 when it is not, or
when anything is left mounted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.agent import wait
from benchmarks.churn import manifests_for
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.node.agent import Agent
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import MountState
from kubevol.testing.mount_rig import mounted_at, mounts_under, unmount_all_under

TARGET = 1.2


def uid_of(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Rounds:
    """The timed rounds against a running agent: new pods dropped one by one, their
    latency recorded by side (healthy/hung), the first pod's CSI mount under ``bindfs``."""

    def __init__(self, agent: Agent, manifests: str, handles: list[str], present: int) -> None:
        self.agent = agent
        self.manifests = manifests
        self.handles = handles
        self.present = present
        self.samples: dict[str, list[float]] = {"healthy": [], "hung": []}
        self.stuck_rounds = 0

    def mounted(self, uid: str) -> int:
        return sum(1 for m in self.agent.pods.manager.actual.mounted_volumes()
                   if m.pod_uid == uid and m.state is MountState.MOUNTED)

    def drop(self, i: int, handle: str) -> None:
        tmp = os.path.join(self.manifests, f".p{i}.yaml")
        with open(tmp, "w") as f:
            f.write(manifests_for(i, handle, scratch=True, uid=uid_of(i)))
        os.rename(tmp, os.path.join(self.manifests, f"p{i}.yaml"))

    def start_present(self) -> None:
        for i in range(self.present):
            self.drop(i, self.handles[i])
        for i in range(self.present):
            wait(f"pod {i} mounted", lambda i=i: self.mounted(uid_of(i)) == 2, 120)

    def run(self, bindfs: subprocess.Popen[bytes], first: str, rounds: int,
            per_round: int) -> None:
        probe = self.agent.runtime.host.probe
        serial = self.present
        for r in range(rounds):
            side = "hung" if r % 2 else "healthy"
            bindfs.send_signal(signal.SIGSTOP if side == "hung" else signal.SIGCONT)
            # A stats refresh meets the mount in its new state (and, frozen, gives up on it
            # at the probe's deadline).
            time.sleep(probe.timeout + 1.5 if side == "hung" else 1.5)
            fresh = list(range(serial, serial + per_round))
            serial += per_round
            for k, i in enumerate(fresh):
                started = time.perf_counter()
                self.drop(i, self.handles[self.present + k])
                wait(f"pod {i} mounted", lambda i=i: self.mounted(uid_of(i)) == 2, 60)
                self.samples[side].append(time.perf_counter() - started)
            for i in fresh:
                os.unlink(os.path.join(self.manifests, f"p{i}.yaml"))
            uids = {uid_of(i) for i in fresh}
            wait("new pods gone", lambda uids=uids: not any(
                m.pod_uid in uids for m in self.agent.pods.manager.actual.mounted_volumes()), 60)
            self.stuck_rounds += side == "hung" and first in probe.stuck()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--present", type=int, default=20, help="pods running throughout")
    parser.add_argument("--rounds", type=int, default=8, help="rounds, alternating sides")
    parser.add_argument("--per-round", type=int, default=5, help="new pods timed per round")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("bindfs") is None:
        print("run as root with bindfs installed: the benchmark mounts", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="kubevol-bench-hung-")
    manifests = os.path.join(work, "manifests")
    os.mkdir(manifests)
    driver = HostPathDriver(HostPathConfig(state_dir=os.path.join(work, "hp"), node_id="n1"))
    running = driver.serve()
    stop = threading.Event()
    bindfs: subprocess.Popen[bytes] | None = None
    try:
        with CSIClient(running.endpoint, timeout=30) as client:
            handles = [
                client.create_volume(
                    f"v{i}", [t.VolumeCapability.mount()],
                    capacity_range=t.CapacityRange(required_bytes=16 << 20)).volume_id
                for i in range(args.present + args.per_round)
            ]
        root = os.path.join(work, "root")
        with NodeRuntime(root, node_name="n1", csi_drivers={DRIVER_NAME: running.endpoint},
                         csi_timeout=30, entry_points=False) as runtime, Agent(
                runtime, manifest_dir=manifests, stats_period=1.0) as agent:
            thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
            thread.start()
            wait("first pass", agent.ready.is_set, 60)
            rounds = Rounds(agent, manifests, handles, args.present)
            rounds.start_present()
            first = os.path.join(root, "pods", uid_of(0), "volumes", "kubernetes.io~csi",
                                 "pv0", "mount")
            os.mkdir(os.path.join(work, "fuse-src"))
            bindfs = subprocess.Popen(["bindfs", "-f", os.path.join(work, "fuse-src"), first])
            wait("bindfs", lambda: mounted_at(Path(first)), 10)
            rounds.run(bindfs, first, args.rounds, args.per_round)
            bindfs.send_signal(signal.SIGCONT)
            stop.set()
            thread.join(60)
    finally:
        stop.set()
        if bindfs is not None:
            bindfs.send_signal(signal.SIGCONT)
            bindfs.terminate()
            bindfs.wait()
        running.stop()
        unmount_all_under(work)
        left = mounts_under(work)
        shutil.rmtree(work, ignore_errors=True)
    return report(rounds, args.present, args.rounds // 2, left)


def report(rounds: Rounds, present: int, hung_rounds: int, left: list[str]) -> int:
    load = os.getloadavg()
    print(f"new pods (an emptyDir and a CSI volume each) beside {present} running, "
          f"hostpath driver in-process, volume stats every 1 s; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for side, values in rounds.samples.items():
        print(f"  {side:>7}: p50 {statistics.median(values) * 1000:6.1f} ms, p99 "
              f"{percentile(values, 0.99) * 1000:6.1f} ms over {len(values)} pods")
    ratio = statistics.median(rounds.samples["hung"]) / statistics.median(
        rounds.samples["healthy"])
    print(f"  hung / healthy, p50: {ratio:.2f}x (target <= {TARGET}x); the frozen mount was "
          f"stuck in the agent's probe in {rounds.stuck_rounds} of {hung_rounds} hung rounds")
    if left:
        print(f"FAILED: left mounted {left[:3]}", file=sys.stderr)
        return 1
    if rounds.stuck_rounds < hung_rounds:
        print("FAILED: the frozen mount was not asked about in every hung round",
              file=sys.stderr)
        return 1
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
