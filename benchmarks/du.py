"""kubevol's du walk against GNU du on a 300,000-file tree, warm cache, in the same run,
each in its own terms: one thread against one du, several threads against as many du
processes.

Usage::

    .venv/bin/python -m benchmarks.du [--files 300000] [--repeat 7] [--tree DIR] [--threads N]

Builds a tree of ``--files`` files in nested directories (one in every 100 a hard link to an
earlier file, a third of the files with 100 bytes of data), warms the cache, then times,
interleaved, the median of ``--repeat`` runs of: ``du -x -s -B1`` and ``du -x -s --inodes``
(GNU coreutils, single-threaded); ``--threads`` GNU du processes at once, each over a share
of the top-level directories (what a parallel du amounts to); kubevol's C walker with one
thread and with ``--threads``; the pure-Python walker (for information). It checks that
kubevol's byte and inode totals equal GNU du's and prints one row per comparison: the C
walker on one thread against one du, and on ``--threads`` against as many du processes
(targets: ratio <= 1.0 each). Exit status 1 if totals differ or a target is missed. The
tree lives in a temporary directory removed at the end, unless ``--tree DIR`` names where
to keep (and reuse) it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import Row, emit, load_average
from kubevol.metrics.walk import default_threads, native_available, walk

FILES_PER_DIR = 500
DIRS_PER_TOP = 20
LINK_EVERY = 100


def build_tree(root: Path, files: int) -> None:
    """Create ``files`` files under ``root`` (idempotent: a complete tree is kept)."""
    stamp = root / f".complete-{files}"
    if stamp.exists():
        return
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    data = b"k" * 100
    made = 0
    last_regular = ""
    top = 0
    while made < files:
        for mid in range(DIRS_PER_TOP):
            if made >= files:
                break
            directory = root / f"top{top:03d}" / f"mid{mid:02d}"
            directory.mkdir(parents=True)
            prefix = str(directory) + "/"
            for i in range(min(FILES_PER_DIR, files - made)):
                path = f"{prefix}f{i:04d}"
                if i % LINK_EVERY == LINK_EVERY - 1 and last_regular:
                    os.link(last_regular, path)
                else:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    if i % 3 == 0:
                        os.write(fd, data)
                    os.close(fd)
                    last_regular = path
                made += 1
        top += 1
    stamp.touch()


def gnu_du(root: Path, *flags: str) -> int:
    out = subprocess.run(
        ["du", "-x", "-s", *flags, str(root)], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[0])


def timed(
    contenders: dict[str, Callable[[], object]], repeat: int
) -> dict[str, tuple[float, object]]:
    """Median wall time and last result of each contender over ``repeat`` rounds.

    Each contender runs once to warm up; then the rounds interleave the contenders, so
    that load from other processes falls on all of them alike.
    """
    results = {name: fn() for name, fn in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), results[name]) for name in contenders}


def parallel_gnu_du(root: Path, processes: int) -> int:
    """GNU du run the way a multi-threaded du would be: ``processes`` du processes at once,
    each over its share of the top-level directories (bytes summed; an inode linked from
    two shares is counted by both, so the total is for timing, not for comparing)."""
    tops = sorted(str(p) for p in root.iterdir() if p.is_dir())
    shares = [tops[i::processes] for i in range(processes)]
    procs = [
        subprocess.Popen(["du", "-x", "-s", "-c", "-B1", *share], stdout=subprocess.PIPE,
                         text=True)
        for share in shares
        if share
    ]  # fmt: skip
    total = 0
    for proc in procs:
        out, _ = proc.communicate()
        total += int(out.splitlines()[-1].split()[0])
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--tree", type=Path, help="keep the tree here and reuse it")
    parser.add_argument("--threads", type=int, default=default_threads())
    args = parser.parse_args(argv)
    print(load_average())

    workdir = None
    if args.tree is None:
        workdir = tempfile.mkdtemp(prefix="kubevol-du-bench-")
        root = Path(workdir) / "tree"
    else:
        root = args.tree
    try:
        start = time.perf_counter()
        build_tree(root, args.files)
        print(f"tree: {root} ({args.files} files, ready in {time.perf_counter() - start:.1f}s)")
        print(f"cpus: {len(os.sched_getaffinity(0))}, native walker threads: {args.threads}")
        if not native_available():
            print("native walker: NOT BUILT (kubevol.metrics._duwalk missing)", file=sys.stderr)
            return 1
        contenders: dict[str, Callable[[], object]] = {
            "du -B1": lambda: gnu_du(root, "-B1"),
            "du --inodes": lambda: gnu_du(root, "--inodes"),
            f"{args.threads} parallel du": lambda: parallel_gnu_du(root, args.threads),
            "native, 1 thread": lambda: _totals(str(root), True, 1),
            f"native, {args.threads} threads": lambda: _totals(str(root), True, args.threads),
            "python": lambda: _totals(str(root), False, 1),
        }
        timings = timed(contenders, args.repeat)
        du_bytes_t, du_bytes = timings["du -B1"]
        du_inodes_t, du_inodes = timings["du --inodes"]
        for name, (seconds, result) in timings.items():
            print(f"{name:<22} {seconds:7.3f}s  {result}")
        ok = True
        for name in ("native, 1 thread", f"native, {args.threads} threads", "python"):
            same = timings[name][1] == (du_bytes, du_inodes)
            ok = ok and same
            print(f"{name}: totals {'equal to' if same else 'DIFFER from'} GNU du's")
        single = Row(
            work=f"du walk, {args.files} files, 1 thread",
            unit="s",
            kubevol=timings["native, 1 thread"][0],
            reference=du_bytes_t,
            reference_name="GNU du -x -s -B1",
            max_ratio=1.0,
        )
        multi = Row(
            work=f"du walk, {args.files} files, {args.threads} threads",
            unit="s",
            kubevol=timings[f"native, {args.threads} threads"][0],
            reference=timings[f"{args.threads} parallel du"][0],
            reference_name=f"{args.threads} GNU du processes over shares of the tree",
            max_ratio=1.0,
        )
        emit(single)
        emit(multi)
        print(f"(pure-Python walker: {timings['python'][0] / du_bytes_t:.1f}x GNU du; "
              f"du --inodes alone: {du_inodes_t:.3f}s)")  # fmt: skip
        print(load_average())
        if not ok:
            print("FAIL: totals differ from GNU du", file=sys.stderr)
            return 1
        return 0 if single.met and multi.met else 1
    finally:
        if workdir is not None:
            shutil.rmtree(workdir)


def _totals(path: str, native: bool, threads: int) -> tuple[int, int]:
    usage = walk(path, native=native, threads=threads)
    return usage.bytes, usage.inodes


if __name__ == "__main__":
    sys.exit(main())
