"""kubevol's du walk against GNU du on a 300,000-file tree, warm cache, in the same run.

Usage::

    .venv/bin/python benchmarks/du.py [--files 300000] [--repeat 7] [--tree DIR] [--threads N]

Builds a tree of ``--files`` files in nested directories (one in every 100 a hard link to an
earlier file, a third of the files with 100 bytes of data), warms the cache, then times
``du -x -s -B1`` and ``du -x -s --inodes`` (GNU coreutils) and kubevol's walk
(``kubevol.metrics.walk.walk``: the C walker if built, and the pure-Python one), taking the
median of ``--repeat`` runs of each. It checks that every byte and inode total agrees,
prints the timings and the ratio kubevol / GNU du, and exits 1 if the totals differ or the
native ratio misses the target (0.8). The tree lives in a temporary directory removed at
the end, unless ``--tree DIR`` names where to keep (and reuse) it.
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

from kubevol.metrics.walk import default_threads, native_available, walk

TARGET_RATIO = 0.8
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--tree", type=Path, help="keep the tree here and reuse it")
    parser.add_argument("--threads", type=int, default=default_threads())
    args = parser.parse_args(argv)

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

        contenders: dict[str, Callable[[], object]] = {
            "du -B1": lambda: gnu_du(root, "-B1"),
            "du --inodes": lambda: gnu_du(root, "--inodes"),
        }
        if native_available():
            contenders["native"] = lambda: _totals(str(root), True, args.threads)
        else:
            print("native walker: NOT BUILT (kubevol.metrics._duwalk missing)")
        contenders["python"] = lambda: _totals(str(root), False, 1)
        timings = timed(contenders, args.repeat)
        du_bytes_t, du_bytes = timings["du -B1"]
        du_inodes_t, du_inodes = timings["du --inodes"]
        print(f"GNU du -x -s -B1      {du_bytes_t:7.3f}s  bytes={du_bytes}")
        print(f"GNU du -x -s --inodes {du_inodes_t:7.3f}s  inodes={du_inodes}")

        ok = True
        results: dict[str, float] = {}
        for name in ("native", "python"):
            if name not in timings:
                continue
            seconds, totals = timings[name]
            same = totals == (du_bytes, du_inodes)
            ok = ok and same
            results[name] = seconds
            assert isinstance(totals, tuple)
            print(
                f"kubevol {name:<13} {seconds:7.3f}s  bytes={totals[0]} inodes={totals[1]}  "
                f"ratio={seconds / du_bytes_t:.2f}x GNU du  totals {'equal' if same else 'DIFFER'}"
            )
        best = results.get("native", results["python"])
        verdict = "meets" if best <= TARGET_RATIO * du_bytes_t else "MISSES"
        print(f"target: kubevol <= {TARGET_RATIO}x GNU du: {verdict} ({best / du_bytes_t:.2f}x)")
        if not ok:
            print("FAIL: totals differ from GNU du", file=sys.stderr)
            return 1
        return 0 if verdict == "meets" else 1
    finally:
        if workdir is not None:
            shutil.rmtree(workdir)


def _totals(path: str, native: bool, threads: int) -> tuple[int, int]:
    usage = walk(path, native=native, threads=threads)
    return usage.bytes, usage.inodes


if __name__ == "__main__":
    sys.exit(main())
