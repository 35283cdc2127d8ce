"""The long-running agent at node speed (issue 36): a real ``kubevol`` agent against the
bundled hostpath driver, each figure against a floor built in the same run that issues the
same driver calls and the same mounts and writes directly.

Usage (as root: real mounts; it re-runs itself in a private mount namespace)::

    .venv/bin/python -m benchmarks.agent [--present 500] [--lone 20] [--burst 50]
        [--burst-rounds 3] [--idle 60] [--restarts 3] [--driver-in-process]

Every pod has an emptyDir, a configMap (its own ConfigMap), a projected service-account
token (a ``Memory`` emptyDir: tmpfs) and a claim bound to a CSI volume of the hostpath
driver on a unix socket. For rows 1-3 the driver is a process of its own (``kubevol driver
serve hostpath``), as a node runs its CSI drivers, and the agent and the floor both call
it; ``--driver-in-process`` serves it in this process instead, the agent's and the floor's
process (as until 2026-11-29: the agent's threads and the driver's handlers then take turns
on one interpreter lock). This process's garbage collector is tuned as ``kubevol`` tunes its
own after its imports (since the night of 2026-11-29; before, the in-process agent ran with Python's
default thresholds, which the agent process does not). For rows 4 and 5, where the agent
is a process of its own, this process serves the same driver state, counting its calls.
The rows:

1. a pod arriving alone with 5 and with ``--present`` pods running: from the manifest's
   rename into the watched directory until all four volumes are mounted in the agent's
   actual state, ``--lone`` pods each, p50 and p99; the floor does the same pod directly
   (directories, the tmpfs mount, the atomic writer's files, ``vol_data.json``,
   NodeStageVolume and NodePublishVolume through a ``CSIClient``), interleaved with the
   agent's pods so that a change in the machine's load hits both. Targets: p50 <= floor +
   30 ms, p99 <= floor + 80 ms, and p50 with ``--present`` / p50 with 5 <= 1.25;
2. a burst of ``--burst`` pods dropped at once, until all are mounted, against the floor
   doing the same pods on 8 threads (the agent's operation workers); median of
   ``--burst-rounds``; <= 2x;
3. a pod removed alone with ``--present`` running: from the manifest's removal until its
   record and its CSI device are gone (NodeUnpublish, NodeUnstage, every directory
   removed); the floor unpublishes, unstages, unmounts and removes directly; p50 <= floor +
   30 ms;
4. restart after SIGKILL: the in-process agent is stopped (volumes stay mounted) and
   ``kubevol agent`` started on the same root and manifests as a process of its own, then
   killed with SIGKILL and started again ``--restarts`` times: the time from the start
   until it logs that it settled (``settled:``, the first time its reconciler has nothing
   left to do) and its status socket lists every volume mounted, and the
   NodeStageVolume/NodePublishVolume calls the driver got after each restart (must be 0:
   nothing remounted). Median <= 1.5 s;
5. the idle CPU of that ``kubevol agent`` process with ``--present`` pods (its own CPU
   time: not the driver's, served by this process, nor the token provider's processes)
   over ``--idle`` seconds of real idle, from 2 s after the first stats refresh that
   follows its start (a one-off: it builds what measures each claim; the window starts
   when the driver got every claim's request and then none for 1 s, and 1 s more), with
   volume stats on the kubelet's 1-minute period and the periodic set-up of configMap and
   projected volumes on the kubelet's 1-minute sync period. With the default 60 s the
   window holds exactly one period of each: the next refresh starts a period after the
   first ended, inside the window. <= 0.3% of a core. Beside it, without a target,
   the floor of that window's NodeGetVolumeStats calls: the CPU a bare grpcio client
   (``benchmarks.stats_floor``, a process of its own) spends sending the same requests the
   driver got from the agent in the window, as a share of the window.

Beside row 4, without a target: what a fresh interpreter takes to import the agent's entry
point, loop and runtime and the kubernetes client's V1Pod model (``AGENT_IMPORTS``: a lower
bound of any start, before a pod is read).

Latencies are taken with a poll of the agent's state every 2 ms; each pod of a burst is looked
at only until it was seen mounted, as the poll runs in the agent's process. Exits 1 when
anything does not converge or is left mounted, or a target is missed.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import psutil

from benchmarks.churn import manifests_for
from benchmarks.report import (
    Row,
    emit,
    reexec_in_private_namespace,
    wait_for_socket,
    with_bytecode,
)
from kubevol.cli.main import tune_gc_after_start_up
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.k8s.tokens import TokenManager, TokenRequest
from kubevol.mount import syscalls
from kubevol.node.agent import Agent
from kubevol.node.agent_status import ask_agent
from kubevol.node.reconciler import HOLDERS_MAX_AGE
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import MountState
from kubevol.plugins.csi.voldata import save_volume_data
from kubevol.testing.call_clock import CallClock
from kubevol.testing.mount_rig import mounts_under, unmount_all_under
from kubevol.testing.token_provider import StandInTokenProvider

#: How the agent and the driver are started as processes of their own: this interpreter
#: and whichever kubevol it imports (the checkout measured, not the venv's install).
KUBEVOL_CLI = (sys.executable, "-c", "from kubevol.cli.main import main; main()")
#: Volumes of each pod (emptyDir, configMap, projected, CSI).
VOLUMES_PER_POD = 4
#: The agent's operation workers (the floor's burst threads).
WORKERS = 8
#: How often the agent's state is looked at while waiting (seconds).
POLL = 0.002


def wait(what: str, check: Callable[..., object], timeout: float) -> float:
    """Seconds until ``check()`` held; raises TimeoutError after ``timeout``."""
    started = time.perf_counter()
    while not check():
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(POLL)
    return time.perf_counter() - started


def wait_each(what: str, check: Callable[[int], bool], items: Sequence[int],
              timeout: float) -> float:
    """Seconds until ``check(item)`` held for every item of ``items``. Each item is looked
    at, in order, only until it held once: a look costs the first pending item's check,
    not the checks of every item done, so the watching takes little of the CPU that the
    agent, in this process, is being timed on."""
    pending = collections.deque(items)

    def done() -> bool:
        while pending and check(pending[0]):
            pending.popleft()
        return not pending

    return wait(what, done, timeout)


def uid_of(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``samples`` (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Floor:
    """What a pod's volumes take when nothing but the work itself is done: the directories,
    the files and the mounts kubevol makes, and the driver's Node calls, issued directly
    under a root of its own."""

    def __init__(self, root: str, client: CSIClient) -> None:
        self.root = root
        self.client = client
        self.tokens = StandInTokenProvider()
        self.capability = t.VolumeCapability.mount()

    def _paths(self, i: int, handle: str) -> tuple[str, str, str]:
        volumes = os.path.join(self.root, "pods", uid_of(i), "volumes")
        staging = os.path.join(self.root, "plugins", "kubernetes.io", "csi", DRIVER_NAME,
                               hashlib.sha256(handle.encode()).hexdigest(), "globalmount")
        target = os.path.join(volumes, "kubernetes.io~csi", f"pv{i}", "mount")
        return volumes, staging, target

    @staticmethod
    def _project(directory: str, name: str, data: bytes) -> None:
        """The atomic writer's layout: a timestamped dir, the file, ``..data`` and the
        name's link."""
        stamp = os.path.join(directory, f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{os.getpid()}")
        os.mkdir(stamp, 0o755)
        with open(os.path.join(stamp, name), "wb") as f:
            f.write(data)
        os.symlink(os.path.basename(stamp), os.path.join(directory, "..data_tmp"))
        os.rename(os.path.join(directory, "..data_tmp"), os.path.join(directory, "..data"))
        os.symlink(f"..data/{name}", os.path.join(directory, name))

    def up(self, i: int, handle: str) -> None:
        volumes, staging, target = self._paths(i, handle)
        os.makedirs(os.path.join(volumes, "kubernetes.io~empty-dir", "scratch"), 0o750)
        config = os.path.join(volumes, "kubernetes.io~configmap", "config")
        os.makedirs(config, 0o750)
        self._project(config, "settings", f"pod {i}\n".encode())
        token = os.path.join(volumes, "kubernetes.io~projected", "token")
        os.makedirs(token, 0o750)
        syscalls.mount("tmpfs", token, "tmpfs", 0)
        issued = self.tokens.request_token(TokenRequest(
            namespace="bench", service_account="default", audiences=(),
            expiration_seconds=3600, pod_name=f"p{i}", pod_uid=uid_of(i)))
        self._project(token, "token", issued.token.encode())
        os.makedirs(staging, 0o750)
        data = {"driverName": DRIVER_NAME, "volumeHandle": handle}
        save_volume_data(os.path.dirname(staging), data)
        self.client.node_stage_volume(handle, staging, self.capability)
        os.makedirs(os.path.dirname(target), 0o750)
        save_volume_data(os.path.dirname(target), data)
        self.client.node_publish_volume(handle, target, self.capability,
                                        staging_target_path=staging)

    def down(self, i: int, handle: str) -> None:
        volumes, staging, target = self._paths(i, handle)
        self.client.node_unpublish_volume(handle, target)
        os.unlink(os.path.join(os.path.dirname(target), "vol_data.json"))
        os.rmdir(os.path.dirname(target))
        self.client.node_unstage_volume(handle, staging)
        os.unlink(os.path.join(os.path.dirname(staging), "vol_data.json"))
        os.rmdir(staging)
        os.rmdir(os.path.dirname(staging))
        syscalls.umount(os.path.join(volumes, "kubernetes.io~projected", "token"))
        shutil.rmtree(os.path.dirname(volumes))


class Node:
    """The in-process agent, its manifest directory and how to watch it."""

    def __init__(self, agent: Agent, manifests: str, handles: dict[int, str]) -> None:
        self.agent = agent
        self.manifests = manifests
        self.handles = handles

    def drop(self, i: int) -> None:
        tmp = os.path.join(self.manifests, f".p{i}.json")
        with open(tmp, "w") as f:
            f.write(manifests_for(i, self.handles[i], full=True, uid=uid_of(i)))
        os.rename(tmp, os.path.join(self.manifests, f"p{i}.json"))

    def delete(self, i: int) -> None:
        os.unlink(os.path.join(self.manifests, f"p{i}.json"))

    def mounted(self, i: int) -> bool:
        """Whether all volumes of pod ``i`` are mounted in the agent's actual state."""
        manager = self.agent.pods.manager
        pod = manager.desired.pod(uid_of(i))
        if pod is None or len(pod.volumes) != VOLUMES_PER_POD:
            return False
        for v in pod.volumes:
            m = manager.actual.pod_volume(v.unique_name, pod.uid)
            if m is None or m.state is not MountState.MOUNTED:
                return False
        return True

    def gone(self, i: int, csi_volume: str) -> bool:
        """Whether pod ``i``'s record and its CSI device are gone."""
        return (uid_of(i) not in self.agent.pods.records
                and self.agent.pods.manager.actual.volume(csi_volume) is None)

    def gone_of(self, csi_volumes: dict[int, str], i: int) -> bool:
        """:meth:`gone` of pod ``i`` with its CSI volume from ``csi_volumes``."""
        return self.gone(i, csi_volumes[i])

    def csi_volume(self, i: int) -> str:
        pod = self.agent.pods.manager.desired.pod(uid_of(i))
        assert pod is not None
        (name,) = [v.unique_name for v in pod.volumes if v.plugin_name == "kubernetes.io/csi"]
        return name

    def arrive(self, i: int) -> float:
        started = time.perf_counter()
        self.drop(i)
        wait(f"pod {i} mounted", lambda: self.mounted(i), 60)
        return time.perf_counter() - started

    def leave(self, i: int) -> float:
        csi = self.csi_volume(i)
        started = time.perf_counter()
        self.delete(i)
        wait(f"pod {i} gone", lambda: self.gone(i, csi), 60)
        return time.perf_counter() - started


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


class Pool:
    """Pod numbers, each with a volume of its own, handed out in order."""

    def __init__(self, client: CSIClient) -> None:
        self.client = client
        self.next = 0
        self.handles: dict[int, str] = {}

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        for i in out:
            self.handles[i] = self.client.create_volume(
                f"v{i}", [t.VolumeCapability.mount()],
                capacity_range=t.CapacityRange(required_bytes=16 << 20)).volume_id
        self.next += n
        return out


Samples = dict[str, list[float]]


def lone_rounds(node: Node, floor: Floor, pool: Pool, n: int, *, leave: bool) -> Samples:
    """``n`` pods arriving alone (and, with ``leave``, leaving alone), each beside one
    the floor does, in turn; seconds per side."""
    samples: Samples = {"arrive": [], "floor arrive": [], "leave": [], "floor leave": []}
    for _ in range(n):
        agent_pod, floor_pod = pool.take(2)
        time.sleep(0.05)  # the agent's loop back in its wait, as for a pod arriving any time
        samples["arrive"].append(node.arrive(agent_pod))
        samples["floor arrive"].append(timed(
            functools.partial(floor.up, floor_pod, pool.handles[floor_pod])))
        # Past the age a pass takes another's snapshot of what holds paths at: a removal
        # any time pays for its own walk of /proc.
        time.sleep(HOLDERS_MAX_AGE + 0.05)
        if leave:
            samples["leave"].append(node.leave(agent_pod))
        else:
            csi = node.csi_volume(agent_pod)
            node.delete(agent_pod)
            wait("pod gone", functools.partial(node.gone, agent_pod, csi), 60)
        samples["floor leave"].append(timed(
            functools.partial(floor.down, floor_pod, pool.handles[floor_pod])))
    return samples


def burst_rounds(node: Node, floor: Floor, pool: Pool, size: int, rounds: int) -> Samples:
    """``rounds`` bursts of ``size`` pods for the agent and for the floor (on WORKERS
    threads); seconds per side."""
    samples: Samples = {"agent": [], "floor": []}
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as threads:
        for _ in range(rounds):
            pods, floor_pods = pool.take(size), pool.take(size)
            time.sleep(0.2)
            started = time.perf_counter()
            for i in pods:
                node.drop(i)
            wait_each("burst mounted", node.mounted, pods, 300)
            samples["agent"].append(time.perf_counter() - started)
            started = time.perf_counter()
            list(threads.map(lambda i: floor.up(i, pool.handles[i]), floor_pods))
            samples["floor"].append(time.perf_counter() - started)
            csis = {i: node.csi_volume(i) for i in pods}
            for i in pods:
                node.delete(i)
            wait_each("burst gone", functools.partial(node.gone_of, csis), pods, 300)
            list(threads.map(lambda i: floor.down(i, pool.handles[i]), floor_pods))
    return samples


class StatsRequests:
    """The NodeGetVolumeStats requests the driver got: (volume_id, volume_path) in order."""

    def __init__(self) -> None:
        self._seen: list[tuple[str, str]] = []
        self._last = 0.0  # time.monotonic() of the last request
        self._lock = threading.Lock()

    def wrap(self, handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """The driver's handler, recording each request."""

        def recorded(request: Any, context: Any) -> Any:
            with self._lock:
                self._seen.append((request.volume_id, request.volume_path))
                self._last = time.monotonic()
            return handler(request, context)

        return recorded

    def quiet_after(self, calls: int, quiet: float) -> bool:
        """Whether ``calls`` requests came since the last take, then none for ``quiet``
        seconds."""
        with self._lock:
            return len(self._seen) >= calls and time.monotonic() - self._last >= quiet

    def take(self) -> list[tuple[str, str]]:
        """The requests since the last take."""
        with self._lock:
            seen, self._seen = self._seen, []
        return seen


#: Modules every start of the agent imports before it reads a pod (a lower bound: it
#: imports more), the kubernetes package's parts loaded on use as the command line has
#: them. The kubernetes client's models are most of it.
AGENT_IMPORTS = ("import kubevol.cli.main, kubevol.cli.kubernetes_package; "
                 "kubevol.cli.kubernetes_package.load_parts_on_use(); "
                 "import kubevol.cli.agent, kubevol.node.agent, kubevol.node.runtime, "
                 "kubernetes.client.models.v1_pod")


def import_seconds(rounds: int = 3) -> float:
    """Median seconds of a fresh interpreter importing :data:`AGENT_IMPORTS`, with the
    bytecode cache as the agent's starts have it."""
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", AGENT_IMPORTS], check=True, env=with_bytecode())
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def bare_client_cpu(endpoint: str, requests: list[tuple[str, str]], work: str) -> float:
    """CPU seconds a bare grpcio client (``benchmarks.stats_floor``) spends sending
    ``requests`` at once and reading the answers (median of its rounds)."""
    path = os.path.join(work, "stats-requests.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(requests, f)
    out = subprocess.run([sys.executable, "-m", "benchmarks.stats_floor", endpoint, path],
                         check=True, capture_output=True, text=True)
    return float(json.loads(out.stdout)["cpu"])


class Restarts:
    """``kubevol agent`` as a process of its own on the in-process agent's root, killed
    and started again."""

    def __init__(self, root: str, *, manifests: str, endpoint: str, work: str,
                 calls: CallClock, pods: int, stats_requests: StatsRequests) -> None:
        self.root = root
        self.endpoint = endpoint
        self.work = work
        self.stats_requests = stats_requests
        #: Each pod has VOLUMES_PER_POD volumes, one of them a claim.
        self.expected, self.claims = pods * VOLUMES_PER_POD, pods
        self.command = [
            *KUBEVOL_CLI, "agent",
            "--root", root, "--node-name", "n1", "--manifests", manifests,
            "--csi-driver", f"{DRIVER_NAME}={endpoint}", "--metrics-address", "",
            "--plugins-registry", "", "--no-entry-points", "-v", "2",
            "--token-provider", "kubevol-stand-in-token-provider",
        ]
        self.log = os.path.join(work, "agent.log")
        self.calls = calls

    def start(self) -> tuple[subprocess.Popen[bytes], float, int]:
        """Start the agent; it, the seconds until it settled, and the NodeStage and
        NodePublish calls the driver got meanwhile. The record of NodeGetVolumeStats
        requests starts again with it."""
        calls = self.calls.calls
        self.stats_requests.take()
        with open(self.log, "w") as log:
            started = time.perf_counter()
            proc = subprocess.Popen(self.command, stderr=log, stdout=subprocess.DEVNULL,
                                    env=with_bytecode())

        def settled() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {proc.returncode}: see {self.log}")
            with open(self.log) as f:
                return "settled:" in f.read()

        wait("agent settled", settled, 120)
        took = time.perf_counter() - started
        rows = ask_agent(self.root, timeout=30) or []
        # "present": set up as a plain directory (the emptyDir and configMap volumes).
        mounted = sum(1 for r in rows if r.get("state") in ("mounted", "present"))
        if mounted != self.expected:
            states: dict[str, int] = {}
            for r in rows:
                states[str(r.get("state"))] = states.get(str(r.get("state")), 0) + 1
            raise RuntimeError(f"settled with {mounted} of {self.expected} volumes mounted "
                               f"({states})")
        return proc, took, self.calls.calls - calls

    def run(self, restarts: int, idle: float) -> RestartFigures:
        """The first start's seconds, then each restart's seconds and calls, the last
        agent's CPU (in cores) over ``idle`` seconds from 2 s after its first stats
        refresh, the bare client's for the NodeGetVolumeStats the agent sent meanwhile (in
        cores over the same time, and how many calls), and the seconds of
        :func:`import_seconds`."""
        proc, first, _ = self.start()
        took, calls = [], []
        try:
            for _ in range(restarts):
                time.sleep(1.0)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                proc, seconds, count = self.start()
                took.append(seconds)
                calls.append(count)
            # The first stats refresh of a start measures every claim once it settled and
            # builds what measures each: a one-off, not idle. The window starts 2 s after
            # it, so that the next refresh, a period after, falls whole inside it.
            wait("the first stats refresh",
                 functools.partial(self.stats_requests.quiet_after, self.claims, 1.0), 120)
            time.sleep(1.0)
            agent = psutil.Process(proc.pid)
            self.stats_requests.take()
            cpu0 = sum(agent.cpu_times()[:2])
            time.sleep(idle)
            cores = (sum(agent.cpu_times()[:2]) - cpu0) / idle
            asked = self.stats_requests.take()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        floor = bare_client_cpu(self.endpoint, asked, self.work) / idle if asked else 0.0
        return RestartFigures(first=first, took=took, calls=calls, idle=cores,
                              idle_floor=floor, stats_calls=len(asked),
                              imports=import_seconds())


@attrs.frozen(kw_only=True)
class RestartFigures:
    """What :meth:`Restarts.run` measured (see there)."""

    first: float
    took: list[float]
    calls: list[int]
    idle: float
    idle_floor: float
    stats_calls: int
    imports: float


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def report(args: argparse.Namespace, *, lone_small: Samples, lone_big: Samples,
           burst: Samples, restarts: RestartFigures) -> list[Row]:
    present, small, idle_seconds = args.present, args.small, args.idle
    one, five, fifteen = os.getloadavg()
    where = "this process" if args.driver_in_process else "a process of its own"
    print(f"pods with an emptyDir, a configMap, a projected token and a CSI volume; rows 1-3 "
          f"with the hostpath driver in {where}; load average {one:.2f} {five:.2f} "
          f"{fifteen:.2f}")
    rows: list[Row] = []
    for label, s in ((f"{small} present", lone_small), (f"{present} present", lone_big)):
        print(f"  pod arriving alone, {label}: agent p50 {ms(statistics.median(s['arrive']))}"
              f" / p99 {ms(percentile(s['arrive'], 0.99))} ms, floor p50 "
              f"{ms(statistics.median(s['floor arrive']))} / p99 "
              f"{ms(percentile(s['floor arrive'], 0.99))} ms over {len(s['arrive'])} pods")
    a50, f50 = ms(statistics.median(lone_big["arrive"])), ms(
        statistics.median(lone_big["floor arrive"]))
    a99, f99 = ms(percentile(lone_big["arrive"], 0.99)), ms(
        percentile(lone_big["floor arrive"], 0.99))
    rows.append(Row(work=f"agent: pod arriving alone, {present} present, p50", unit="ms",
                    kubevol=a50, reference=f50, reference_name="floor",
                    max_value=round(f50 + 30, 2)))
    rows.append(Row(work=f"agent: pod arriving alone, {present} present, p99", unit="ms",
                    kubevol=a99, reference=f99, reference_name="floor",
                    max_value=round(f99 + 80, 2)))
    small50 = ms(statistics.median(lone_small["arrive"]))
    rows.append(Row(work=f"agent: pod arriving alone, p50 with {present} vs {small} present",
                    unit="ms", kubevol=a50, reference=small50,
                    reference_name=f"{small} present", max_ratio=1.25))
    b, fb = statistics.median(burst["agent"]), statistics.median(burst["floor"])
    print(f"  bursts: agent {[ms(x) for x in burst['agent']]} ms, floor "
          f"{[ms(x) for x in burst['floor']]} ms")
    rows.append(Row(work=f"agent: burst of pods, {present} present, median", unit="ms",
                    kubevol=ms(b), reference=ms(fb), reference_name="floor on 8 threads",
                    max_ratio=2.0))
    l50, fl50 = ms(statistics.median(lone_big["leave"])), ms(
        statistics.median(lone_big["floor leave"]))
    print(f"  pod removed alone, {present} present: agent p50 {l50} / p99 "
          f"{ms(percentile(lone_big['leave'], 0.99))} ms, floor p50 {fl50} ms")
    rows.append(Row(work=f"agent: pod removed alone, {present} present, p50", unit="ms",
                    kubevol=l50, reference=fl50, reference_name="floor",
                    max_value=round(fl50 + 30, 2)))
    first, took, calls, idle = restarts.first, restarts.took, restarts.calls, restarts.idle
    print(f"  idle with {present} pods: kubevol agent process {idle:.3%} of a core over "
          f"{idle_seconds:.0f} s (volume stats every 60 s; the driver and the token "
          f"provider's processes not included); a bare grpcio client sending the same "
          f"{restarts.stats_calls} NodeGetVolumeStats: {restarts.idle_floor:.3%} of a core")
    rows.append(Row(work=f"agent: idle CPU, {present} pods, stats every 1m", unit="% core",
                    kubevol=round(idle * 100, 4), reference=0.3, reference_name="issue's bound",
                    max_value=0.3))
    rows.append(Row(work=f"agent: idle CPU, {present} pods, against its stats calls' floor",
                    unit="% core", kubevol=round(idle * 100, 4),
                    reference=round(restarts.idle_floor * 100, 4),
                    reference_name=f"a bare grpcio client, the same {restarts.stats_calls} "
                                   "NodeGetVolumeStats"))
    print(f"  kubevol agent start on the running root: {first:.2f} s; restarts after SIGKILL: "
          f"{[round(x, 2) for x in took]} s, NodeStage+NodePublish calls {calls}; a fresh "
          f"interpreter importing what every start does: {restarts.imports:.2f} s")
    median = round(statistics.median(took), 3)
    rows.append(Row(work=f"agent: restart after SIGKILL, {present} pods, settled, median",
                    unit="s", kubevol=median, reference=1.5,
                    reference_name="issue's bound", max_value=1.5))
    rows.append(Row(work=f"agent: restart after SIGKILL, {present} pods, against its imports",
                    unit="s", kubevol=median, reference=round(restarts.imports, 3),
                    reference_name="the imports alone"))
    rows.append(Row(work="agent: NodeStage/NodePublish calls after restarts", unit="calls",
                    kubevol=float(sum(calls)), reference=0.0, reference_name="none",
                    max_value=0.0))
    return rows


Figures = tuple[Samples, Samples, Samples]


@contextlib.contextmanager
def served_here(endpoint: str, state_dir: str, *, mounting: CallClock | None = None,
                stats: StatsRequests | None = None) -> Iterator[None]:
    """The hostpath driver of ``state_dir`` on ``endpoint``, served by this process until
    the block ends; with ``mounting``, its NodeStageVolume and NodePublishVolume calls
    counted; with ``stats``, its NodeGetVolumeStats requests recorded."""
    driver = HostPathDriver(HostPathConfig(state_dir=state_dir, node_id="n1"))
    node_service: Any = driver.plugin.node
    if mounting is not None:
        for rpc in ("node_stage_volume", "node_publish_volume"):
            setattr(node_service, rpc, mounting.wrap(getattr(node_service, rpc)))
    if stats is not None:
        node_service.node_get_volume_stats = stats.wrap(node_service.node_get_volume_stats)
    running = driver.serve(endpoint)
    try:
        yield
    finally:
        running.stop()


@contextlib.contextmanager
def driver_process(endpoint: str, state_dir: str) -> Iterator[None]:
    """The hostpath driver on ``endpoint`` (a unix socket), served by a process of its own
    (``kubevol driver serve hostpath``) until the block ends, as a node runs its CSI
    drivers: the in-process agent's threads and the driver's handlers do not take turns
    on one interpreter lock, the floor's calls and the agent's alike."""
    command = [*KUBEVOL_CLI, "driver", "serve", "hostpath", "--endpoint", endpoint,
               "--state-dir", state_dir, "--node-id", "n1", "--v", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=with_bytecode())
    try:
        wait_for_socket(endpoint.removeprefix("unix://"), proc, timeout=60)
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def in_process(args: argparse.Namespace, *, work: str, manifests: str, endpoint: str,
               client: CSIClient) -> Figures:
    """Rows 1 to 4, against an agent run in this process (as ``kubevol agent`` runs it)."""
    pool = Pool(client)
    floor = Floor(os.path.join(work, "floor"), client)
    stop = threading.Event()
    with NodeRuntime(os.path.join(work, "root"), node_name="n1",
                     csi_drivers={DRIVER_NAME: endpoint}, csi_timeout=30, entry_points=False,
                     tokens=TokenManager(StandInTokenProvider())) as runtime, Agent(
            runtime, manifest_dir=manifests) as agent:
        node = Node(agent, manifests, pool.handles)
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait("first pass", agent.ready.is_set, 60)
            present = pool.take(args.small)
            for i in present:
                node.drop(i)
            wait_each("first pods mounted", node.mounted, present, 120)
            lone_small = lone_rounds(node, floor, pool, args.lone, leave=False)
            more = pool.take(args.present - args.small)
            started = time.perf_counter()
            for i in more:
                node.drop(i)
            wait_each("all mounted", node.mounted, more, 900)
            print(f"  {len(more)} more pods up in {time.perf_counter() - started:.1f} s",
                  flush=True)
            lone_big = lone_rounds(node, floor, pool, args.lone, leave=True)
            burst = burst_rounds(node, floor, pool, args.burst, args.burst_rounds)
        finally:
            stop.set()
            thread.join(60)
    return lone_small, lone_big, burst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--present", type=int, default=500)
    parser.add_argument("--small", type=int, default=5, help="pods present in the flat check")
    parser.add_argument("--lone", type=int, default=20, help="lone pods timed per size")
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--burst-rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=60.0,
                        help="seconds of idle measured (60: one stats period)")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--driver-in-process", action="store_true",
                        help="serve the driver in this process for rows 1-3 as well (before "
                             "2026-11-29 afternoon; default: a process of its own)")
    args = parser.parse_args()
    reexec_in_private_namespace("benchmarks.agent")
    # The in-process agent's collector as `kubevol agent`'s: what the imports made frozen,
    # young collections every 50,000 allocations (with the default 700, collections walk
    # the 500 pods' objects over and over, which the agent process does not).
    tune_gc_after_start_up()
    work = tempfile.mkdtemp(prefix="kubevol-bench-agent-")
    manifests = os.path.join(work, "manifests")
    os.mkdir(manifests)
    state_dir = os.path.join(work, "hp")
    endpoint = "unix://" + os.path.join(work, "csi.sock")
    try:
        first = (served_here(endpoint, state_dir) if args.driver_in_process
                 else driver_process(endpoint, state_dir))
        with first, CSIClient(endpoint, timeout=30) as client:
            lone_small, lone_big, burst = in_process(
                args, work=work, manifests=manifests, endpoint=endpoint, client=client)
        # Rows 4 and 5: the same driver state served here, where its calls are counted.
        mounting, stats_requests = CallClock(), StatsRequests()
        with served_here(endpoint, state_dir, mounting=mounting, stats=stats_requests):
            restarts = Restarts(
                os.path.join(work, "root"), manifests=manifests, endpoint=endpoint,
                work=work, calls=mounting, pods=args.present, stats_requests=stats_requests,
            ).run(args.restarts, args.idle)
        rows = report(args, lone_small=lone_small, lone_big=lone_big, burst=burst,
                      restarts=restarts)
        for row in rows:
            emit(row)
        return 0 if all(row.met for row in rows) else 1
    finally:
        # The pods stay up when the agent stops: what is left mounted is theirs.
        unmount_all_under(work)
        left = mounts_under(work)
        if left:
            print(f"FAILED: left mounted {left[:3]}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
