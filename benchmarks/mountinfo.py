"""Benchmark: parse a 20,000-entry mountinfo (plain, and with escaped names), and find the
mount references of one path.

Run: ``.venv/bin/python -m benchmarks.mountinfo`` (as root it also shows that a changed
mount table is re-read, in a private mount namespace it creates for itself).

Measured in the same run, interleaved:

* **parse**: kubevol's ``parse_mountinfo`` (every line into a ``MountInfo``) against
  libmount's C parser as ``findmnt -F FILE --list -o ID`` (the list form: findmnt's default
  tree output takes minutes at this size). Target: ratio <= 1.0. For information also
  libmount in this process through ctypes (``mnt_new_table_from_file``: the parse alone,
  no Python objects) and kubevol's pure-Python parser. Twice: on a plain table, and on one
  where every pod volume line has names with spaces, tabs and backslashes, escaped as the
  kernel writes them (``\\040``, ``\\011``, ``\\134``) in its mount point and source.
* **search**: read the file into a :class:`~kubevol.mount.MountTable` and run Kubernetes'
  ``SearchMountPoints`` for one staging path (what the unstage guard does), against the
  straightforward Python way (split every line, then scan). Target: <= 10 ms.

Then: repeated checks through a :class:`~kubevol.mount.MountTableCache` on
``/proc/self/mountinfo`` do not re-read an unchanged table (the kernel flags a change with
POLLPRI|POLLERR on the open file).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import Row, emit, interleaved_samples, load_average
from kubevol.mount import (
    MountInfo,
    MountTable,
    MountTableCache,
    parse_mountinfo,
    search_mount_points,
)
from kubevol.mount.mountinfo import escape, parse_mountinfo_bytes
from kubevol.mount.mountread import read_mountinfo_bytes

ENTRIES = 20_000
TARGET_MS = 10.0
ROUNDS = 30
KUBELET = "/var/lib/kubelet"


def build_mountinfo(path: Path, entries: int = ENTRIES, *, escaped: bool = False) -> str:
    """Write a kubelet node's mount table with ``entries`` lines; return the staging path
    whose references are searched (placed in the middle, with two other users).

    ``escaped``: every pod volume's name (and a CSI volume's device) has a space, a tab or
    a backslash, written escaped as in the kernel's table."""
    rng = random.Random(42)
    # "my data", "cache\tdir", "a\\b", escaped by the kernel's rule.
    odd = [escape(f" {n}") for n in ("my data", "cache\tdir", "a\\b")] if escaped else [""]
    lines = [
        "22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,discard",
        "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
        "24 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw",
    ]
    staging = f"{KUBELET}/plugins/kubernetes.io/csi/lustre.csi.example.com/{'a' * 64}/globalmount"
    mount_id = 100
    while len(lines) < entries - 3:
        mount_id += 1
        pod = uuid.UUID(int=rng.getrandbits(128))
        kind = rng.choice(["projected", "secret", "configmap", "csi"])
        if kind == "csi":
            lines.append(
                f"{mount_id} 22 259:{rng.randrange(1, 64)} / {KUBELET}/pods/{pod}/volumes/"
                f"kubernetes.io~csi/pvc-{pod.hex[:8]}{rng.choice(odd)}/mount rw,relatime "
                f"shared:{mount_id} - ext4 /dev/nvme1n{rng.randrange(1, 64)}{rng.choice(odd)} rw"
            )
        else:
            lines.append(
                f"{mount_id} 22 0:{mount_id} / {KUBELET}/pods/{pod}/volumes/kubernetes.io~"
                f"{kind}/vol-{mount_id}{rng.choice(odd)} rw,relatime shared:{mount_id} - tmpfs "
                "tmpfs rw,size=4194304k,inode64"
            )
    middle = len(lines) // 2
    lustre = "rw,relatime - lustre 10.0.0.4@tcp:/lustrefs rw,flock,lazystatfs"
    lines.insert(middle, f"9001 22 2389:4120 / {staging} {lustre}")
    lines.insert(middle + 50, f"9002 22 2389:4120 / {KUBELET}/plugins/x/globalmount {lustre}")
    lines.append(f"9003 22 2389:4120 / {KUBELET}/pods/p/volumes/kubernetes.io~csi/v/mount {lustre}")
    path.write_text("\n".join(lines) + "\n")
    return staging


def kubevol_refs(path: str, target: str) -> list[str]:
    """kubevol: read the table, search it."""
    return search_mount_points(MountTable(read_mountinfo_bytes(path)), target)


def naive_refs(path: str, target: str) -> list[str]:
    """The obvious Python: split every line, keep the fields, scan backwards, filter."""
    with open(path) as f:
        text = f.read()
    entries = []
    for line in text.splitlines():
        fields = line.split()
        sep = fields.index("-", 6)
        entries.append((int(fields[0]), fields[2], fields[3], fields[4], fields[sep + 1]))
    for mount_id, dev, root, point, _ in reversed(entries):
        if target == point or target.startswith(point.rstrip("/") + "/"):
            rel = target[len(point):].lstrip("/")
            want = os.path.normpath(os.path.join(root, rel))
            return [e[3] for e in entries if e[0] != mount_id and e[1] == dev and e[2] == want]
    raise RuntimeError("no containing mount")


def timed(fn: Callable[[], object], rounds: int = ROUNDS) -> tuple[float, float]:
    """(best, median) wall time in milliseconds."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return min(samples), statistics.median(samples)


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median milliseconds of each contender (:func:`interleaved_samples`)."""
    samples = interleaved_samples(contenders, rounds)
    return {name: statistics.median(values) for name, values in samples.items()}


def findmnt(path: str) -> None:
    """libmount's parse of ``path`` as findmnt does it, printing one column."""
    subprocess.run(
        ["findmnt", "-F", path, "--list", "--noheadings", "-o", "ID"],
        stdout=subprocess.DEVNULL,
        check=True,
    )


def libmount_in_process(path: str) -> Callable[[], object] | None:
    """libmount's parse of ``path`` in this process (``mnt_new_table_from_file``), or None
    when libmount is not installed."""
    name = ctypes.util.find_library("mount")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    lib.mnt_new_table_from_file.restype = ctypes.c_void_p
    lib.mnt_new_table_from_file.argtypes = [ctypes.c_char_p]
    lib.mnt_table_get_nents.argtypes = [ctypes.c_void_p]
    lib.mnt_unref_table.argtypes = [ctypes.c_void_p]
    encoded = os.fsencode(path)

    def parse() -> int:
        table = lib.mnt_new_table_from_file(encoded)
        count: int = lib.mnt_table_get_nents(table)
        lib.mnt_unref_table(table)
        return count

    return parse


def enter_private_mount_namespace() -> bool:
    """unshare(CLONE_NEWNS) and make every mount private; False when not permitted."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        return False
    ms_rec, ms_private = 0x4000, 0x40000
    rc: int = libc.mount(b"none", b"/", None, ms_rec | ms_private, None)
    return rc == 0


def cache_demo() -> None:
    """Show that an unchanged /proc/self/mountinfo is not re-read, and a change is."""
    private = os.geteuid() == 0 and enter_private_mount_namespace()
    with MountTableCache() as cache, tempfile.TemporaryDirectory() as tmp:
        cache.table()
        _, median = timed(cache.table, 1000)
        print(
            f"cached check, unchanged table: {median * 1000:.1f} us median over 1000 calls "
            f"(one poll() each), table reads: {cache.reads}"
        )
        if not private:
            print("change detection demo skipped: needs root for a private mount namespace")
            return
        subprocess.run(["mount", "-t", "tmpfs", "bench", tmp], check=True)
        try:
            table = cache.table()
            seen = table.find_mount_point(os.path.realpath(tmp)) is not None
            print(f"after mounting a tmpfs: table reads: {cache.reads}, new mount seen: {seen}")
        finally:
            subprocess.run(["umount", tmp], check=True)
        cache.table()
        print(f"after unmounting it: table reads: {cache.reads}")


def pure_python(path: Path) -> list[MountInfo]:
    """kubevol's pure-Python parser on the file at ``path``."""
    return parse_mountinfo_bytes(path.read_bytes(), native=False)


def parse_rows(tmp: Path) -> list[Row]:
    """The parse rows: a plain table, and one with escaped names."""
    rows = []
    for kind, escaped in (("plain", False), ("with escapes", True)):
        path = Path(tmp) / f"mountinfo-{kind.replace(' ', '-')}"
        build_mountinfo(path, escaped=escaped)
        entries = parse_mountinfo(str(path))
        assert entries == parse_mountinfo_bytes(path.read_bytes(), native=False)
        odd = sum(1 for line in path.read_bytes().splitlines() if b"\\" in line)
        print(f"\nmountinfo {kind}: {len(entries)} entries ({odd} with escapes), "
              f"{path.stat().st_size / 1e6:.1f} MB")
        parsers: dict[str, Callable[[], object]] = {
            "kubevol parse_mountinfo": functools.partial(parse_mountinfo, str(path)),
            "findmnt -F --list": functools.partial(findmnt, str(path)),
        }
        in_process = libmount_in_process(str(path))
        if in_process is not None:
            assert in_process() == len(entries)
            parsers["libmount in-process (info)"] = in_process
        parsers["kubevol pure Python (info)"] = functools.partial(pure_python, path)
        parse = interleaved(parsers, ROUNDS)
        print(f"{'':30} {'median ms':>10}")
        for name, ms in parse.items():
            print(f"{name:30} {ms:10.2f}")
        rows.append(Row(
            work=f"mountinfo parse, {ENTRIES:,} lines, {kind}",
            unit="ms",
            kubevol=parse["kubevol parse_mountinfo"],
            reference=parse["findmnt -F --list"],
            reference_name="findmnt -F --list (libmount)",
            max_ratio=1.0,
        ))
    return rows


def main() -> int:
    """Run the benchmark; 0 when kubevol meets its targets."""
    print(load_average())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mountinfo"
        target = build_mountinfo(path)
        ours = kubevol_refs(str(path), target)
        assert ours == naive_refs(str(path), target), "kubevol and naive disagree"
        print(f"refs of one path: {ours}")
        rows = parse_rows(Path(tmp))
        search = interleaved(
            {
                "kubevol read+search": lambda: kubevol_refs(str(path), target),
                "naive split parse+search": lambda: naive_refs(str(path), target),
            },
            ROUNDS,
        )
    print(f"\n{'':30} {'median ms':>10}")
    for name, ms in search.items():
        print(f"{name:30} {ms:10.2f}")
    rows.append(Row(
        work=f"SearchMountPoints, {ENTRIES} lines",
        unit="ms",
        kubevol=search["kubevol read+search"],
        reference=search["naive split parse+search"],
        reference_name="naive Python split+scan",
        max_value=TARGET_MS,
    ))
    for row in rows:
        emit(row)
    cache_demo()
    print(load_average())
    return 0 if all(row.met for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
