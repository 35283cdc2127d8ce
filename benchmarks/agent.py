"""``kubevol agent`` with 500 static pods dropped at once, each with an emptyDir and a CSI
volume on the bundled hostpath driver: time until all are mounted, until all are gone after
the manifests are deleted, the split driver / gRPC / kubevol, and the agent's idle cost.

Usage (as root: real bind mounts)::

    unshare -m --propagation private .venv/bin/python benchmarks/agent.py [--pods 500] [--idle 20]

The driver and the agent run in this process (the driver on a unix socket, the agent in a
thread, as ``kubevol agent`` runs it). The manifests are written under temporary names and
renamed into the watched directory one after the other, as fast as Python can. Time is split
as ``benchmarks/churn.py`` does: the driver (inside its Node RPC handlers), gRPC (client
call time minus the driver's) and kubevol (the rest). The reference for "idle" is the
target itself: under 1% of one core with every pod running, measured over ``--idle``
seconds of process CPU time (driver included) once everything converged, with the
periodic volume-stats refresh measured separately (its CPU time, amortised over the
kubelet's default 1m period); RSS is the whole process's. It exits 1 if anything does not
converge or is left mounted, or the loop's idle CPU is over 1%.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

from benchmarks.churn import manifests_for
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.node.agent import Agent
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import MountState
from kubevol.testing.call_clock import CallClock
from kubevol.testing.mount_rig import mounts_under, unmount_all_under


def wait(what: str, check: Any, timeout: float) -> float:
    """Seconds until ``check()`` held; raises TimeoutError after ``timeout``."""
    started = time.perf_counter()
    while not check():
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(0.01)
    return time.perf_counter() - started


Phases = dict[str, tuple[float, float, float]]


def drop_and_delete(
    agent: Agent, manifests: str, texts: list[str], in_driver: CallClock, in_grpc: CallClock,
    *, idle_seconds: float,
) -> tuple[Phases, float, int, float]:
    """Drop every manifest, wait until all volumes are mounted, measure idle cost, delete
    the manifests, wait until all is gone. Returns the phases (wall, driver, client call
    seconds), idle CPU (cores), RSS (bytes) and one stats refresh (seconds)."""
    manager = agent.pods.manager

    def mounted() -> int:
        return sum(1 for m in manager.actual.mounted_volumes() if m.state is MountState.MOUNTED)

    phases: Phases = {}
    d0, g0, started = in_driver.seconds, in_grpc.seconds, time.perf_counter()
    for i, text in enumerate(texts):
        tmp = os.path.join(manifests, f".p{i}.yaml")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, os.path.join(manifests, f"p{i}.yaml"))
    wait("all mounted", lambda: mounted() == 2 * len(texts), 600)
    phases["up"] = (time.perf_counter() - started, in_driver.seconds - d0, in_grpc.seconds - g0)

    time.sleep(1.0)  # let the loop settle into its idle period
    idle_cpu, rss = idle_cost(idle_seconds)
    me = psutil.Process()
    cpu_before = sum(me.cpu_times()[:2])
    agent.metrics.stats.refresh()
    refresh = sum(me.cpu_times()[:2]) - cpu_before  # CPU seconds, driver's share included

    d0, g0, started = in_driver.seconds, in_grpc.seconds, time.perf_counter()
    for i in range(len(texts)):
        os.unlink(os.path.join(manifests, f"p{i}.yaml"))
    wait("all gone", lambda: not manager.actual.volumes() and not agent.pods.records, 600)
    phases["down"] = (time.perf_counter() - started, in_driver.seconds - d0,
                      in_grpc.seconds - g0)
    return phases, idle_cpu, rss, refresh


def idle_cost(seconds: float) -> tuple[float, int]:
    """This process's CPU (in cores) over ``seconds`` of doing nothing, and its RSS."""
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(me.cpu_times()[:2]) - cpu0) / seconds, me.memory_info().rss


def report(
    pods: int, phases: Phases, idle: tuple[float, float], rss: int, refresh: float
) -> None:
    idle_cpu, idle_seconds = idle
    load = os.getloadavg()
    print(f"{pods} static pods (an emptyDir and a CSI volume each), hostpath driver "
          f"in-process; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for phase, (total, drv, calls) in phases.items():
        print(f"  {phase:>4}: {total:6.2f} s ({total / pods * 1000:6.2f} ms per pod); call time "
              f"summed over 8 workers: driver {drv:6.2f} s, gRPC {calls - drv:5.2f} s, "
              f"kubevol {max(0.0, total * 8 - calls):6.2f} worker-s at most")
    print(f"  idle with {pods} pods running: {idle_cpu:.2%} of one core over "
          f"{idle_seconds:.0f} s (target < 1%), RSS {rss / 2**20:.0f} MiB (driver included)")
    print(f"  one volume-stats refresh ({pods} claims, every 1m by default): "
          f"{refresh:.2f} CPU-s (driver's NodeGetVolumeStats included) = {refresh / 60:.2%} "
          f"of a core amortised over the period; loop + stats: "
          f"{idle_cpu + refresh / 60:.2%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--idle", type=float, default=20.0,
                        help="seconds over which idle CPU is measured")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: the benchmark makes real bind mounts", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="kubevol-bench-agent-")
    manifests = os.path.join(work, "manifests")
    os.mkdir(manifests)
    driver = HostPathDriver(HostPathConfig(state_dir=os.path.join(work, "hp"), node_id="n1"))
    in_driver, in_grpc = CallClock(), CallClock()
    node_service: Any = driver.plugin.node
    for rpc in ("node_stage_volume", "node_unstage_volume", "node_publish_volume",
                "node_unpublish_volume", "node_get_capabilities"):
        setattr(node_service, rpc, in_driver.wrap(getattr(node_service, rpc)))
    running = driver.serve()
    stop = threading.Event()
    try:
        with CSIClient(running.endpoint, timeout=30) as client:
            texts = [
                manifests_for(i, scratch=True, handle=client.create_volume(
                    f"v{i}", [t.VolumeCapability.mount()],
                    capacity_range=t.CapacityRange(required_bytes=16 << 20)).volume_id)
                for i in range(args.pods)
            ]
        with NodeRuntime(os.path.join(work, "root"), node_name="n1",
                         csi_drivers={DRIVER_NAME: running.endpoint}, csi_timeout=30,
                         entry_points=False) as runtime:
            csi_client = runtime.registry.client(DRIVER_NAME)
            csi_client.call = in_grpc.wrap(csi_client.call)  # type: ignore[method-assign]
            # The periodic volume-stats refresh is measured on its own (below), not left to
            # land inside the idle window by chance.
            with Agent(runtime, manifest_dir=manifests, stats_period=3600) as agent:
                thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
                thread.start()
                wait("first pass", agent.ready.is_set, 60)
                phases, idle_cpu, rss, refresh = drop_and_delete(
                    agent, manifests, texts, in_driver, in_grpc, idle_seconds=args.idle)
                stop.set()
                thread.join(60)
        report(args.pods, phases, (idle_cpu, args.idle), rss, refresh)
        left = mounts_under(work)
        if left:
            print(f"FAILED: left mounted {left[:3]}", file=sys.stderr)
            return 1
        if idle_cpu >= 0.01:
            print("FAILED: idle CPU over 1% of a core", file=sys.stderr)
            return 1
        return 0
    finally:
        stop.set()
        running.stop()
        unmount_all_under(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
