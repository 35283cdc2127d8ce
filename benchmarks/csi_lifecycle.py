"""Full CSI volume lifecycles against the hostpath driver, and the conformance suite's time.

Run as root: ``.venv/bin/python benchmarks/csi_lifecycle.py [--lifecycles 40] [--skip-suite]``
(it re-executes itself in a private mount namespace, so no mount can leak to the host).

1. **Lifecycles.** ``kubevol driver serve hostpath`` runs as a separate process on a unix
   socket. Each lifecycle is CreateVolume, NodeStageVolume, NodePublishVolume,
   NodeUnpublishVolume, NodeUnstageVolume, DeleteVolume (real bind mounts, state saved
   atomically after every change), run by 1 and by 8 concurrent clients. The reference,
   measured in the same run, is the same work done directly with no gRPC and no state:
   mkdir, ``mount --bind`` (stage), ``mount --bind`` (publish), ``umount`` twice, rmdir,
   with the same concurrency. The ratio is kubevol's rate over the reference's rate.
2. **Conformance suite.** ``pytest --pyargs kubevol.csi.sanity`` against the hostpath
   driver (mount mode, attach on), against the reference of the same suite against the
   in-memory mock (the difference is what real mounts and state cost).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient

NS_MARKER = "KUBEVOL_BENCH_PRIVATE_NS"
CAP = t.VolumeCapability.mount()


def reexec_in_private_namespace() -> None:
    """Run this script again under ``unshare -m --propagation private`` (once)."""
    if os.environ.get(NS_MARKER) == "1":
        return
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark makes real mounts")
    env = {**os.environ, NS_MARKER: "1"}
    args = ["unshare", "-m", "--propagation", "private", sys.executable, *sys.argv]
    os.execvpe("unshare", args, env)


def run(*cmd: str) -> None:
    """Run a command; fail loudly."""
    subprocess.run(cmd, check=True, capture_output=True)


class DriverProcess:
    """``kubevol driver serve hostpath`` in a child process."""

    def __init__(self, work: Path, *extra: str) -> None:
        self.socket = work / "hostpath.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kubevol.cli.main", "driver", "serve", "hostpath",
             "--state-dir", str(work / "state"), "--node-id", "bench",
             "--endpoint", f"unix://{self.socket}", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the hostpath driver did not start")
            time.sleep(0.05)

    @property
    def endpoint(self) -> str:
        """The driver's endpoint."""
        return f"unix://{self.socket}"

    def stop(self) -> None:
        """SIGTERM and wait."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def csi_lifecycle(client: CSIClient, work: Path, n: int) -> None:
    """One full lifecycle through the driver."""
    staging = work / f"staging-{n}"
    staging.mkdir()
    target = str(work / "pods" / f"p{n}" / "mount")
    vol = client.create_volume(f"bench-{n}", [CAP])
    client.node_stage_volume(vol.volume_id, str(staging), CAP)
    client.node_publish_volume(vol.volume_id, target, CAP, staging_target_path=str(staging))
    client.node_unpublish_volume(vol.volume_id, target)
    client.node_unstage_volume(vol.volume_id, str(staging))
    client.delete_volume(vol.volume_id)
    staging.rmdir()


def raw_lifecycle(work: Path, n: int) -> None:
    """The same mounts with mount(8)/umount(8), no gRPC, no state."""
    volume, staging, target = work / f"vol-{n}", work / f"rs-{n}", work / "rpods" / f"p{n}"
    volume.mkdir()
    staging.mkdir()
    target.mkdir(parents=True)
    run("mount", "--bind", str(volume), str(staging))
    run("mount", "--bind", str(staging), str(target))
    run("umount", str(target))
    target.rmdir()
    run("umount", str(staging))
    staging.rmdir()
    volume.rmdir()


def rate(jobs: int, concurrency: int, one: Callable[[int], None]) -> float:
    """Lifecycles per second running ``jobs`` of ``one`` on ``concurrency`` threads."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in [pool.submit(one, i) for i in range(jobs)]:
            future.result()
    return jobs / (time.perf_counter() - start)


def bench_lifecycles(work: Path, lifecycles: int) -> None:
    """Print the lifecycle rates with 1 and 8 clients, and their ratio to raw mounts."""
    driver = DriverProcess(work, "--capacity", "10Ti")
    local = threading.local()
    clients: list[CSIClient] = []
    lock = threading.Lock()

    def client() -> CSIClient:
        found: CSIClient | None = getattr(local, "client", None)
        if found is None:
            found = CSIClient(driver.endpoint, timeout=60)
            local.client = found
            with lock:
                clients.append(found)
        return found

    counter = iter(range(1 << 30))
    try:
        print(f"{'clients':>7}  {'kubevol/s':>10}  {'raw mount/s':>11}  {'ratio':>6}")
        for concurrency in (1, 8):
            jobs = lifecycles * concurrency
            rate(concurrency, concurrency, lambda i: csi_lifecycle(client(), work, next(counter)))
            kv = rate(jobs, concurrency, lambda i: csi_lifecycle(client(), work, next(counter)))
            raw = rate(jobs, concurrency, lambda i: raw_lifecycle(work, next(counter)))
            print(f"{concurrency:>7}  {kv:>10.1f}  {raw:>11.1f}  {kv / raw:>6.2f}")
    finally:
        for c in clients:
            c.close()
        driver.stop()


def bench_suite(work: Path) -> None:
    """Print the conformance suite's wall time against hostpath and against the mock."""

    def timed(endpoint: str, name: str) -> float:
        suite = work / f"suite-{name}"
        suite.mkdir()
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
             "kubevol.csi.sanity", "--csi-endpoint", endpoint,
             "--csi-staging-dir", str(suite / "staging"), "--csi-mount-dir", str(suite / "mnt")],
            cwd=suite, capture_output=True, text=True, check=False,
        )  # fmt: skip
        elapsed = time.perf_counter() - start
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
        print(f"  {name:<9} {elapsed:6.2f} s   ({summary})")
        return elapsed

    hostpath_dir = work / "hp-suite"
    hostpath_dir.mkdir()
    driver = DriverProcess(hostpath_dir, "--enable-attach")
    mock_socket = work / "mock.sock"
    mock = subprocess.Popen(
        [sys.executable, "-m", "kubevol.cli.main", "driver", "serve", "mock", "--mock-mount",
         "--endpoint", f"unix://{mock_socket}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not mock_socket.exists():
            time.sleep(0.05)
        print("conformance suite wall time:")
        hp = timed(driver.endpoint, "hostpath")
        ref = timed(f"unix://{mock_socket}", "mock")
        print(f"  ratio hostpath / mock: {hp / ref:.2f}")
    finally:
        driver.stop()
        mock.send_signal(signal.SIGTERM)
        mock.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=40, help="lifecycles per client")
    parser.add_argument("--skip-suite", action="store_true", help="only the lifecycle rates")
    args = parser.parse_args()
    reexec_in_private_namespace()
    work = Path(tempfile.mkdtemp(prefix="kubevol-bench-"))
    try:
        bench_lifecycles(work, args.lifecycles)
        if not args.skip_suite:
            bench_suite(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
