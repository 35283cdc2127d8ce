"""What the last line of defence costs: one :class:`kubevol.node.holders.Holders` snapshot
(one walk of /proc: every process's cwd, root, exe and descriptors, plus one mountinfo per
other mount namespace) with N extra processes on the node, some working or holding files
under the pods directory; then the questions of a 500-pod ``down`` pass against it.

References measured in the same run: psutil (``process_iter`` + ``cwd()`` +
``open_files()``, the library the issue names) and ``lsof +D`` (a recursive walk of the
directory: it stats every file below it).

    .venv/bin/python benchmarks/holders.py --processes 500
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import psutil

from kubevol.node.holders import Holders


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _psutil_scan(under: str) -> list[int]:
    prefix = under + "/"
    found = []
    for proc in psutil.process_iter():
        try:
            paths = [proc.cwd(), *(f.path for f in proc.open_files())]
        except (psutil.Error, OSError):
            continue
        if any(p == under or p.startswith(prefix) for p in paths):
            found.append(proc.pid)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pods = os.path.join(tmp, "pods")
        dirs = []
        for i in range(args.pods):
            d = os.path.join(pods, f"pod-{i:05d}", "volumes", "kubernetes.io~empty-dir", "v")
            os.makedirs(d)
            with open(os.path.join(d, "f"), "w") as f:
                f.write("x")
            dirs.append(d)
        children: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(args.processes):
                # One in ten works in a pod volume, one in ten holds a file there open.
                cwd = dirs[i % len(dirs)] if i % 10 == 0 else tmp
                argv = ["sleep", "600"] if i % 10 != 1 else [
                    "sh", "-c", f"exec 3<{dirs[i % len(dirs)]}/f; exec sleep 600"]
                children.append(subprocess.Popen(argv, cwd=cwd))
            time.sleep(0.5)
            total = len(psutil.pids())
            snap = Holders.take(pods)
            held = sum(1 for d in dirs if snap.of(d))
            take = _median_ms(lambda: Holders.take(pods), args.runs)
            ask = _median_ms(lambda: [snap.of(d) for d in dirs], args.runs)
            ref = _median_ms(lambda: _psutil_scan(pods), max(3, args.runs // 2))
            lsof = _median_ms(
                lambda: subprocess.run(["lsof", "-n", "+D", pods], capture_output=True,
                                       check=False), 3)
        finally:
            for child in children:
                child.kill()
            for child in children:
                child.wait()
    load = os.getloadavg()
    print(f"processes on the node: {total} ({args.processes} started), "
          f"other mount namespaces: {len(snap.namespaces)}, pod volumes held: {held}")
    print(f"Holders.take (one /proc walk)        {take:8.1f} ms")
    print(f"{args.pods} questions (one per pod volume)  {ask:8.1f} ms")
    print(f"psutil cwd+open_files walk           {ref:8.1f} ms   ratio {take / ref:.2f}x")
    print(f"lsof -n +D pods                      {lsof:8.1f} ms   ratio {take / lsof:.2f}x")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (shared machine)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
