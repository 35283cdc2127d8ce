"""Covers kubevol.node.manager and kubevol.node.records across crashes.

Crash tests: an agent process killed with SIGKILL at random points while pods churn, and
a CSI driver killed in the middle of NodeStageVolume.

The agent (``agent_process.py``) follows the pod records under the root, as ``kubevol up``
and ``down`` leave them; the hostpath driver runs in its own process
(``driver_process.py``). Everything is real: bind mounts, tmpfs, gRPC over a unix socket.
While pods come and go, a sampler checks after every step that no pod that was seen
running lost its volume, its staging mount or a file written into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.node.desired import desired_pod
from kubevol.node.host import NodeVolumeHost
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import parse_manifests
from kubevol.node.records import PodRecord, PodRecords, PodState
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import MountState
from kubevol.testing.mount_rig import unmount_all_under
from kubevol.testing.waiting import wait_until

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

HERE = Path(__file__).resolve().parent
#: Pods started during the churn, and the CSI volumes they share.
PODS = int(os.environ.get("KUBEVOL_CRASH_PODS", "100"))
VOLUMES = 6
#: How many times the agent is killed at least.
KILLS = 12
SEED = int(os.environ.get("KUBEVOL_CRASH_SEED", "20250613"))


def spawn(script: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a helper script; it is killed with the test process if that dies first."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            ["setpriv", "--pdeathsig=KILL", "--", sys.executable, str(HERE / script), *args],
            stdout=out, stderr=subprocess.STDOUT,
        )


def reconcile_until(manager: NodeVolumeManager, predicate: Any, what: str) -> None:
    """Run reconciler passes until ``predicate()`` holds (30 s at most)."""

    def step() -> bool:
        manager.reconcile()
        return bool(predicate())

    wait_until(step, 30, what)


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(30)


@attrs.define
class Driver:
    """The hostpath driver process."""

    tmp: Path
    endpoint: str
    state_dir: Path
    gate: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        sock = Path(self.endpoint[len("unix://"):])
        if sock.exists():
            sock.unlink()
        self.proc = spawn(
            "driver_process.py", "--endpoint", self.endpoint, "--state-dir",
            str(self.state_dir), "--stage-gate", str(self.gate), log=self.tmp / "driver.log",
        )
        wait_until(sock.exists, 30, "the driver's socket")

    def client(self) -> CSIClient:
        return CSIClient(self.endpoint, timeout=10)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    """The hostpath driver in its own process; mounts under tmp_path are undone after."""
    if os.geteuid() != 0:
        pytest.fail("the crash tests need root (real mounts)")
    d = Driver(tmp=tmp_path, endpoint=f"unix://{tmp_path}/hp.sock",
               state_dir=tmp_path / "hp-state", gate=tmp_path / "stage-gate")
    d.start()
    try:
        yield d
    finally:
        stop(d.proc, signal.SIGTERM)
        unmount_all_under(tmp_path)


def create_volumes(driver: Driver, count: int) -> list[str]:
    with driver.client() as client:
        return [
            client.create_volume(f"vol{i}", [t.VolumeCapability.mount()],
                                 capacity_range=t.CapacityRange(required_bytes=16 << 20)
                                 ).volume_id
            for i in range(count)
        ]


def pod_objects(i: int, handle_index: int, handle: str) -> list[dict[str, Any]]:
    """Pod ``p<i>`` with a CSI volume (``pv<handle_index>``), an emptyDir on disk and, for
    odd ``i``, an emptyDir in memory; with the PV and the claim."""
    pv = f"pv{handle_index}"
    volumes: list[dict[str, Any]] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": f"claim{handle_index}"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    if i % 2:
        volumes.append({"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}})
    return [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": f"p{i}", "namespace": "default", "uid": pod_uid(i)},
         "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": volumes}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": f"claim{handle_index}", "namespace": "default"},
         "spec": {"volumeName": pv, "accessModes": ["ReadWriteOnce"]}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                  "csi": {"driver": DRIVER_NAME, "volumeHandle": handle}}},
    ]


def pod_uid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


@attrs.define
class Pod:
    index: int
    uid: str
    pv: str
    handle: str
    memory: bool
    seen: bool = False


class World:
    """The root, the records, the agent process and the invariant checks."""

    def __init__(self, tmp: Path, driver: Driver, handles: list[str]) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.root.mkdir()
        self.driver = driver
        self.handles = handles
        self.host = NodeVolumeHost(root_dir=str(self.root), node_name="node-1")
        self.records = PodRecords(self.host)
        self.running: dict[str, Pod] = {}
        self.violations: list[str] = []
        self.markers: list[str] = []
        self.agent: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    # -- the agent ---------------------------------------------------------------

    def start_agent(self) -> None:
        ready = self.tmp / "agent.ready"
        if ready.exists():
            ready.unlink()
        self.agent = spawn(
            "agent_process.py", "--root", str(self.root), "--ready", str(ready),
            "--driver", f"{DRIVER_NAME}={self.driver.endpoint}", log=self.tmp / "agent.log",
        )

    def agent_ready(self) -> bool:
        return (self.tmp / "agent.ready").exists()

    def kill_agent(self) -> None:
        stop(self.agent)
        self.restarts += 1

    # -- pods ------------------------------------------------------------------------

    def add(self, i: int, rng: random.Random) -> None:
        j = rng.randrange(len(self.handles))
        pod = Pod(index=i, uid=pod_uid(i), pv=f"pv{j}", handle=self.handles[j],
                  memory=bool(i % 2))
        self.records.write(PodRecord(uid=pod.uid, state=PodState.RUNNING,
                                     objects=tuple(pod_objects(i, j, pod.handle))))
        self.running[pod.uid] = pod

    def terminate(self, uid: str) -> None:
        record = self.records.read(uid)
        assert record is not None
        self.records.write(PodRecord(uid=uid, state=PodState.TERMINATING, objects=record.objects))
        del self.running[uid]

    def paths(self, pod: Pod) -> dict[str, str]:
        vols = self.root / "pods" / pod.uid / "volumes"
        digest = hashlib.sha256(pod.handle.encode()).hexdigest()
        out = {
            "data": str(vols / "kubernetes.io~csi" / pod.pv / "mount"),
            "staging": str(self.root / "plugins" / "kubernetes.io" / "csi" / DRIVER_NAME
                           / digest / "globalmount"),
            "scratch": str(vols / "kubernetes.io~empty-dir" / "scratch"),
        }
        if pod.memory:
            out["mem"] = str(vols / "kubernetes.io~empty-dir" / "mem")
        return out

    # -- checks ----------------------------------------------------------------------

    def sample(self) -> None:
        """Note pods that came up (and write a file into each of their volumes); check
        that every pod seen up still has its mounts and files."""
        mounts = {e.mount_point for e in parse_mountinfo()}
        for pod in list(self.running.values()):
            p = self.paths(pod)
            up = (p["data"] in mounts and p["staging"] in mounts and os.path.isdir(p["scratch"])
                  and (not pod.memory or p["mem"] in mounts))
            if not pod.seen:
                if up:
                    self._write_markers(pod, p)
                continue
            for name in ("data", "staging", "mem"):
                if name in p and p[name] not in mounts:
                    self.violations.append(f"{pod.uid} lost its {name} mount {p[name]}")
            for name in ("data", "scratch", "mem"):
                if name in p and not self._marker_ok(pod, p[name]):
                    self.violations.append(f"{pod.uid} lost the file in its {name} volume")

    def _write_markers(self, pod: Pod, p: dict[str, str]) -> None:
        try:
            for name in ("data", "scratch", "mem"):
                if name in p:
                    Path(p[name], f"{pod.uid}.txt").write_text(pod.uid)
        except OSError:
            return  # came up and went in between: try again later
        pod.seen = True
        self.markers.append(f"{pod.pv}/{pod.uid}.txt")

    @staticmethod
    def _marker_ok(pod: Pod, directory: str) -> bool:
        try:
            return Path(directory, f"{pod.uid}.txt").read_text() == pod.uid
        except OSError:
            return False

    def not_converged(self) -> list[str]:
        """Why the node is not as the records say yet (empty: converged)."""
        self.sample()
        why = [f"{r.uid} still terminating" for r in self.records.all()
               if r.state is PodState.TERMINATING]
        why += [f"{p.uid} not up" for p in self.running.values() if not p.seen]
        on_disk = set(os.listdir(self.root / "pods")) if (self.root / "pods").exists() else set()
        why += [f"{uid} left on disk" for uid in sorted(on_disk - set(self.running))]
        return why

    def explain(self, why: list[str]) -> str:
        """What is on disk and in the agent's log about the pods in ``why``."""
        lines = []
        log = (self.tmp / "agent.log").read_text(errors="replace").splitlines()
        for uid in sorted({w.split()[0] for w in why})[:2]:
            pod_dir = self.root / "pods" / uid
            for d, _, files in os.walk(pod_dir):
                lines += [f"  {d}/{f}" for f in files] or [f"  {d}/"]
            lines += [f"  mount {m.mount_point}" for m in parse_mountinfo()
                      if m.mount_point.startswith(str(pod_dir))]
            lines += [f"  log: {line[:300]}" for line in log if uid in line][-6:]
        return "\n".join(lines)

    def churn_with_kills(
        self, rng: random.Random, *, pods: int, kills: int, pause: tuple[float, float],
        kill_within: float, converge_every: int | None, timeout: float,
    ) -> None:
        """Add ``pods`` pods (and terminate some) at random while SIGKILLing the agent at a
        random point of its work, at least ``kills`` times, waiting for convergence every
        ``converge_every`` kills; then a last kill and restart, and convergence."""
        next_kill: float | None = None  # set once the agent has rebuilt its state
        added = 0
        while added < pods or self.restarts < kills:
            if added < pods and (rng.random() < 0.7 or not self.running):
                self.add(added, rng)
                added += 1
            elif added < pods and self.running:
                self.terminate(rng.choice(sorted(self.running)))
            self.sample()
            time.sleep(rng.uniform(*pause))
            if next_kill is None and self.agent_ready():
                # Kill it somewhere in its work: right after start-up or well into it.
                next_kill = time.monotonic() + rng.uniform(0.0, kill_within)
            if next_kill is not None and time.monotonic() >= next_kill:
                self.kill_agent()
                self.start_agent()
                next_kill = None
                if converge_every and self.restarts % converge_every == 0:
                    self.wait_converged(timeout)
        self.kill_agent()
        self.start_agent()
        self.wait_converged(timeout)

    def terminate_all_and_check(self, *, timeout: float) -> None:
        """Terminate every running pod, wait for convergence, and check nothing is left and
        nothing was lost."""
        for uid in sorted(self.running):
            self.terminate(uid)
        self.wait_converged(timeout)
        self.assert_all_gone_and_nothing_lost()

    def assert_all_gone_and_nothing_lost(self) -> None:
        """After every pod was terminated and the agent converged: no record, no mount and
        no pod directory is left, every marker file written into a CSI volume is still in
        the driver's storage, and no invariant was violated on the way."""
        assert self.records.all() == []
        assert [m for m in parse_mountinfo() if m.mount_point.startswith(str(self.root))] == []
        assert os.listdir(self.root / "pods") == []
        kept = {
            f"{os.path.basename(d)}/{f}"
            for d, _, files in os.walk(self.driver.state_dir) for f in files
            if f.endswith(".txt")
        }
        # Files are kept per volume directory; map each pv to its volume id to compare.
        by_pv = {f"pv{j}": h for j, h in enumerate(self.handles)}
        missing = [m for m in self.markers
                   if f"{by_pv[m.split('/')[0]]}/{m.split('/')[1]}" not in kept]
        assert missing == [], f"files lost from CSI volumes: {missing[:5]}"
        assert self.violations == []

    def wait_converged(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while why := self.not_converged():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no convergence after {timeout} s: {why[:5]}\n{self.explain(why)}"
                )
            time.sleep(0.02)


def test_agent_killed_at_random_points_converges_without_losing_anything(
    tmp_path: Path, driver: Driver
) -> None:
    """SIGKILL the agent at random points while pods churn: after each restart it rebuilds
    from disk and converges; no pod seen running ever loses a mount, its staging or a file;
    in the end nothing is leaked and every file written to a CSI volume is still there."""
    rng = random.Random(SEED)
    world = World(tmp_path, driver, create_volumes(driver, VOLUMES))
    world.start_agent()
    try:
        world.churn_with_kills(rng, pods=PODS, kills=KILLS, pause=(0.01, 0.06),
                               kill_within=0.8, converge_every=4, timeout=60)
        assert world.violations == []
        assert len(world.running) > 0 and all(p.seen for p in world.running.values())
        # Most pods were seen running (some went before they were up) and were churned
        # across many restarts.
        assert len(world.markers) >= PODS // 2, (len(world.markers), world.restarts)

        world.terminate_all_and_check(timeout=60)
        assert world.restarts >= KILLS
        print(f"crash test: {PODS} pods, {len(world.markers)} seen up, "
              f"{world.restarts} agent kills")
    finally:
        stop(world.agent, signal.SIGTERM)


def test_driver_killed_in_node_stage_leaves_uncertain_state_that_converges(
    tmp_path: Path, driver: Driver
) -> None:
    """The driver dies inside NodeStageVolume (after mounting, before answering): the device
    is uncertain; once the driver is back the volume is staged, published and, when the pod
    goes, unstaged, with nothing left."""
    [handle] = create_volumes(driver, 1)
    root = tmp_path / "root"
    objects = pod_objects(1, 0, handle)
    manifests = parse_manifests(
        "\n---\n".join(json.dumps(o) for o in objects)
    )
    driver.gate.write_text("hold")
    with NodeRuntime(str(root), node_name="node-1", csi_timeout=10, registration_timeout=5,
                     csi_drivers={DRIVER_NAME: driver.endpoint}) as runtime:
        manager = NodeVolumeManager(runtime.host, runtime.mgr, workers=2,
                                    initial_backoff=0.05, max_backoff=0.5)
        manager.set_pod(desired_pod(runtime.mgr, manifests.pods[0], manifests))
        entered = Path(str(driver.gate) + ".entered")
        reconcile_until(manager, entered.exists, "NodeStageVolume to be entered")
        stop(driver.proc)  # SIGKILL in the middle of the call
        driver.gate.unlink()
        entered.unlink()
        manager.executor.wait_idle(30)
        [volume] = [v for v in manager.actual.volumes() if v.plugin_name == "kubernetes.io/csi"]
        assert volume.device_state is MountState.UNCERTAIN
        [failure] = [f for f in manager.executor.failures() if f.kind == "mount-device"]
        assert "UNAVAILABLE" in str(failure.error) or "unavailable" in str(failure.error).lower()

        driver.start()
        result = manager.sync(timeout=60)
        assert result.converged, result
        [volume] = [v for v in manager.actual.volumes() if v.plugin_name == "kubernetes.io/csi"]
        assert volume.device_state is MountState.MOUNTED
        assert volume.device_mount_path in {m.mount_point for m in parse_mountinfo()}

        manager.remove_pod(pod_uid(1))
        result = manager.sync(timeout=60)
        assert result.converged, result
        assert [m for m in parse_mountinfo() if m.mount_point.startswith(str(root))] == []
        manager.close()


def test_driver_down_while_the_pod_goes_unstages_once_it_is_back(
    tmp_path: Path, driver: Driver
) -> None:
    """A stage interrupted by the driver's death, then the pod removed while the driver is
    down: the uncertain device is unstaged as soon as the driver is back."""
    [handle] = create_volumes(driver, 1)
    root = tmp_path / "root"
    manifests = parse_manifests(
        "\n---\n".join(json.dumps(o) for o in pod_objects(2, 0, handle))
    )
    driver.gate.write_text("hold")
    with NodeRuntime(str(root), node_name="node-1", csi_timeout=10, registration_timeout=5,
                     csi_drivers={DRIVER_NAME: driver.endpoint}) as runtime:
        manager = NodeVolumeManager(runtime.host, runtime.mgr, workers=2,
                                    initial_backoff=0.05, max_backoff=0.5)
        manager.set_pod(desired_pod(runtime.mgr, manifests.pods[0], manifests))
        entered = Path(str(driver.gate) + ".entered")
        reconcile_until(manager, entered.exists, "NodeStageVolume to be entered")
        stop(driver.proc)
        driver.gate.unlink()
        manager.executor.wait_idle(30)
        manager.remove_pod(pod_uid(2))
        result = manager.sync(timeout=1)
        assert not result.converged  # the driver is away: the device cannot be unstaged yet
        staged = [m.mount_point for m in parse_mountinfo()
                  if m.mount_point.startswith(str(root)) and m.mount_point.endswith("globalmount")]
        assert len(staged) == 1  # the driver did mount before it died
        driver.start()
        result = manager.sync(timeout=60)
        assert result.converged, result
        assert [m for m in parse_mountinfo() if m.mount_point.startswith(str(root))] == []
        assert manager.actual.volumes() == []
        manager.close()
