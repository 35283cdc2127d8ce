"""Benchmark: ``kubevol down`` of many pods (an emptyDir and a CSI volume each, the bundled
hostpath driver), against the same RPCs and removals issued directly, in the same run.

Run as root: ``.venv/bin/python -m benchmarks.down [--pods 500] [--small 100]``
(it re-executes itself in a private mount namespace).

The hostpath driver is served in this process on a unix socket, every RPC it answers
counted by name. ``kubevol up`` (the CLI, a separate process, not timed) brings the pods
up; then ``kubevol down`` tears them all down: its wall time and its CPU time (the child
process's user + system) are measured. The pods are brought up again, and the reference
does the same tear-down directly, from a process of its own (start-up counted, as for the
CLI), on as many threads as kubevol's workers (8): exactly the
RPCs the driver answered during ``kubevol down`` (NodeUnpublishVolume and
NodeUnstageVolume on each pod's paths, and as many of every other RPC), then the removals
(``vol_data.json`` files, the pod's directories, the emptyDir's files). The same is done
with ``--small`` pods to see how kubevol's CPU grows with the number of pods.

Targets: ``kubevol down`` wall time <= 1.2x the reference's; CPU per pod at ``--pods``
<= 1.25x CPU per pod at ``--small`` (linear).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.report import Row, emit, load_average
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.layout import sha256_hex
from kubevol.mount.mountinfo import parse_mountinfo

NS_MARKER = "KUBEVOL_BENCH_PRIVATE_NS"
WORKERS = 8
CAP = t.VolumeCapability.mount()
SIZE = t.CapacityRange(required_bytes=16 << 20)
ARGUMENT_FREE = frozenset({
    "get_plugin_info", "get_plugin_capabilities", "probe", "controller_get_capabilities",
    "node_get_capabilities", "node_get_info", "group_controller_get_capabilities",
})  # fmt: skip


def reexec_in_private_namespace() -> None:
    """Run this module again under ``unshare -m --propagation private`` (once)."""
    if os.environ.get(NS_MARKER) == "1":
        return
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark makes real mounts")
    env = {**os.environ, NS_MARKER: "1"}
    args = ["unshare", "-m", "--propagation", "private", sys.executable, "-m",
            "benchmarks.down", *sys.argv[1:]]  # fmt: skip
    os.execvpe("unshare", args, env)


class RpcCounter:
    """Counts the RPCs a driver answers, by method name, from any thread."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def wrap_service(self, service: Any) -> None:
        """Count every public method of ``service`` (a CSI service object)."""
        for name in dir(service):
            method = getattr(service, name)
            if name.startswith("_") or not callable(method):
                continue
            setattr(service, name, self._wrap(name, method))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    def take(self) -> collections.Counter[str]:
        """The counts so far, then start again from zero."""
        with self._lock:
            counts, self.counts = self.counts, collections.Counter()
        return counts


def manifests(handles: list[str]) -> str:
    """Pods with an emptyDir and a CSI PersistentVolume each (multi-document YAML)."""
    docs: list[dict[str, Any]] = []
    for i, handle in enumerate(handles):
        docs += [
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv{i}"},
             "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                      "csi": {"driver": DRIVER_NAME, "volumeHandle": handle}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": f"c{i}", "namespace": "bench"},
             "spec": {"volumeName": f"pv{i}", "accessModes": ["ReadWriteOnce"]}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"p{i}", "namespace": "bench",
                          "uid": str(uuid.UUID(int=i + 1))},
             "spec": {"containers": [{"name": "c", "image": "x"}],
                      "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"c{i}"}},
                                  {"name": "scratch", "emptyDir": {}}]}},
        ]  # fmt: skip
    return "\n---\n".join(json.dumps(d) for d in docs)


def kubevol(*args: str) -> tuple[float, float]:
    """Run the kubevol CLI; (wall, CPU) seconds of the process. Exits on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", *args], capture_output=True, text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"kubevol {args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def direct_down(plan_file: str) -> None:
    """The reference tear-down, run as its own process (start-up included, like the CLI's):
    the plan names the root, the driver, the volumes and the RPCs to issue."""
    plan = json.loads(Path(plan_file).read_text())
    root, handles = Path(plan["root"]), plan["handles"]
    rpcs: collections.Counter[str] = collections.Counter(plan["rpcs"])
    client = CSIClient(plan["endpoint"], timeout=60)
    per_pod = {"node_unpublish_volume", "node_unstage_volume"}
    extra = {name: n for name, n in rpcs.items() if name not in per_pod}

    def pod(i: int) -> None:
        uid = str(uuid.UUID(int=i + 1))
        pod_dir = root / "pods" / uid
        volume_dir = pod_dir / "volumes" / "kubernetes.io~csi" / f"pv{i}"
        staging_dir = root / "plugins/kubernetes.io/csi" / DRIVER_NAME / sha256_hex(handles[i])
        if rpcs["node_unpublish_volume"]:
            client.node_unpublish_volume(handles[i], str(volume_dir / "mount"))
        os.unlink(volume_dir / "vol_data.json")
        with contextlib.suppress(FileNotFoundError):  # the driver removes its target
            os.rmdir(volume_dir / "mount")
        os.rmdir(volume_dir)
        if rpcs["node_unstage_volume"]:
            client.node_unstage_volume(handles[i], str(staging_dir / "globalmount"))
        os.unlink(staging_dir / "vol_data.json")
        os.rmdir(staging_dir / "globalmount")
        os.rmdir(staging_dir)
        shutil.rmtree(pod_dir)

    def other(name: str) -> None:
        # The argument-free RPCs (info, capabilities, probe); the client's capability
        # calls answer from a cache unless asked to refresh.
        if name not in ARGUMENT_FREE:
            raise SystemExit(f"the reference does not know how to repeat {name}")
        method = getattr(client, name)
        if "refresh" in inspect.signature(method).parameters:
            method(refresh=True)
        else:
            method()

    with ThreadPoolExecutor(WORKERS) as pool:
        jobs = [pool.submit(pod, i) for i in range(len(handles))]
        jobs += [pool.submit(other, name) for name, n in extra.items() for _ in range(n)]
        for job in jobs:
            job.result()
    client.close()


def measure(pods: int) -> tuple[float, float, float, collections.Counter[str]]:
    """(kubevol down wall, its CPU, reference wall, the RPCs of kubevol down) for ``pods``."""
    work = Path(tempfile.mkdtemp(prefix="kubevol-bench-down-"))
    counter = RpcCounter()
    driver = HostPathDriver(HostPathConfig(state_dir=str(work / "hp"), node_id="n1"))
    for service in (driver.plugin.identity, driver.plugin.controller, driver.plugin.node):
        counter.wrap_service(service)
    running = driver.serve()
    root = work / "root"
    try:
        with CSIClient(running.endpoint, timeout=60) as client:
            handles = [
                client.create_volume(f"v{i}", [CAP], capacity_range=SIZE).volume_id
                for i in range(pods)
            ]
            manifest = work / "pods.yaml"
            manifest.write_text(manifests(handles))
            common = ["--root", str(root), "--node-name", "n1",
                      "--csi-driver", f"{DRIVER_NAME}={running.endpoint}"]  # fmt: skip
            kubevol("up", *common, str(manifest))
            counter.take()
            wall, cpu = kubevol("down", *common, str(manifest))
            rpcs = counter.take()
            kubevol("up", *common, str(manifest))
            plan = work / "plan.json"
            plan.write_text(json.dumps({"root": str(root), "endpoint": running.endpoint,
                                        "handles": handles, "rpcs": dict(rpcs)}))
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "benchmarks.down", "--direct", str(plan)],
                           check=True)
            reference = time.perf_counter() - started
        left = [e.mount_point for e in parse_mountinfo() if e.mount_point.startswith(str(work))]
        if left:
            sys.exit(f"left mounted: {left[:3]}")
    finally:
        running.stop()
        for e in reversed(parse_mountinfo()):
            if e.mount_point.startswith(str(work)):
                subprocess.run(["umount", "-l", e.mount_point], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return wall, cpu, reference, rpcs


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when the targets are met."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--direct", metavar="PLAN", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.direct:
        direct_down(args.direct)
        return 0
    reexec_in_private_namespace()
    print(load_average())
    small = measure(args.small)
    big = measure(args.pods)
    for pods, (wall, cpu, reference, rpcs) in ((args.small, small), (args.pods, big)):
        print(f"{pods} pods: kubevol down {wall:.2f} s wall, {cpu:.2f} s CPU "
              f"({cpu / pods * 1000:.1f} ms per pod); direct {reference:.2f} s; "
              f"RPCs: {dict(rpcs)}")  # fmt: skip
    wall, cpu, reference, _ = big
    row = Row(
        work=f"kubevol down, {args.pods} pods (emptyDir + CSI)",
        unit="s",
        kubevol=wall,
        reference=reference,
        reference_name="same RPCs and removals, direct",
        max_ratio=1.2,
    )
    emit(row)
    growth = (cpu / args.pods) / (small[1] / args.small)
    cpu_row = Row(
        work=f"kubevol down CPU per pod, {args.pods} vs {args.small} pods",
        unit="ms/pod",
        kubevol=cpu / args.pods * 1000,
        reference=small[1] / args.small * 1000,
        reference_name=f"at {args.small} pods",
        max_ratio=1.25,
    )
    emit(cpu_row)
    print(f"CPU per pod grows {growth:.2f}x from {args.small} to {args.pods} pods")
    print(load_average())
    return 0 if row.met and cpu_row.met else 1


if __name__ == "__main__":
    sys.exit(main())
