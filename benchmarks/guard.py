"""Benchmark: the unstage guard on a node with 20,000 mounts, against its own reference
search, in the same run.

Run: ``.venv/bin/python -m benchmarks.guard [--entries 20000] [--rounds 30]``

Builds a kubelet root on disk (the directories and ``vol_data.json`` files the guard reads)
and a mount table of ``--entries`` lines shaped like a busy node: a third of the mounts are
on the kubelet root's own filesystem (subPath binds under the root, which make every mount
of that device a candidate for "where else is the root visible"), the rest tmpfs volumes;
one Lustre-like filesystem holds eight staged volumes, each published to two pods, one
through a sub-directory bind. Then it times, warm, on one :class:`~kubevol.mount.MountTable`:

- the reference: Kubernetes' ``SearchMountPoints`` for the staging path
  (:func:`~kubevol.mount.search_mount_points`: find the mount, list the others of its
  device and root);
- ``check_unmount_device`` under ``safe`` (with and without a detach following) and under
  ``kubelet``: the same search plus attributing every reference (reading the
  ``vol_data.json`` beside it), finding where the root is visible, and the verdict.

Every call gets a fresh ``MountTable`` over the same bytes, so no call profits from what an
earlier one looked up.

Target: each guard check <= 2x the reference search (best of ``--rounds`` interleaved runs).
Exit status 1 when missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import Row, emit, interleaved_samples, load_average
from kubevol.layout import sha256_hex
from kubevol.mount import MountTable, UnmountVerdict, check_unmount_device, search_mount_points

DRIVER = "lustre.csi.example.com"
LUSTRE = "- lustre 10.0.0.4@tcp:/lustrefs rw,flock,lazystatfs"
ROOT_DEV = "252:1"
LUSTRE_DEV = "2389:4120"
VOLUMES = 8


def build_node(base: Path, entries: int) -> tuple[Path, str, bytes]:
    """Create the kubelet root under ``base``; return (root, the staging path checked, the
    mount table)."""
    root = base / "kubelet"
    mid = 100
    lines = [
        f"22 1 {ROOT_DEV} / / rw,relatime shared:1 - ext4 /dev/vda1 rw",
        "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
    ]

    def add(dev: str, fs_root: str, point: str, tail: str) -> None:
        nonlocal mid
        mid += 1
        lines.append(f"{mid} 22 {dev} {fs_root} {point} rw,relatime shared:{mid} {tail}")

    stagings = []
    for v in range(VOLUMES):
        handle = f"lustrefs/vol-{v}"
        staging = root / "plugins/kubernetes.io/csi" / DRIVER / sha256_hex(handle) / "globalmount"
        staging.mkdir(parents=True)
        (staging.parent / "vol_data.json").write_text(
            json.dumps({"driverName": DRIVER, "volumeHandle": handle})
        )
        add(LUSTRE_DEV, "/", str(staging), LUSTRE)
        stagings.append(str(staging))
        for p in range(2):
            pod = root / "pods" / str(uuid.uuid4()) / "volumes/kubernetes.io~csi" / f"pv-{v}"
            (pod / "mount").mkdir(parents=True)
            (pod / "vol_data.json").write_text(
                json.dumps({"driverName": DRIVER, "volumeHandle": handle, "specVolID": f"pv-{v}"})
            )
            add(LUSTRE_DEV, "/" if p == 0 else "/team", str(pod / "mount"), LUSTRE)
    fs_root = os.path.realpath(root)
    while len(lines) < entries:
        uid = uuid.uuid4()
        if len(lines) % 3 == 0:
            source = f"{fs_root}/pods/{uid}/volumes/kubernetes.io~empty-dir/cache/sub"
            point = f"{root}/pods/{uid}/volume-subpaths/cache/app/0"
            add(ROOT_DEV, source, point, "- ext4 /dev/vda1 rw")
        else:
            point = f"{root}/pods/{uid}/volumes/kubernetes.io~projected/kube-api-access"
            add(f"0:{mid}", "/", point, "- tmpfs tmpfs rw,size=4194304k")
    return root, stagings[VOLUMES // 2], ("\n".join(lines) + "\n").encode()


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Best milliseconds of each contender, run in turn ``rounds`` times. The best, not the
    median: a check takes a millisecond or two, the scheduler's slices on a shared machine
    are longer, so the median measures the neighbours as much as the code."""
    samples = interleaved_samples(contenders, rounds)
    for name, values in samples.items():
        print(f"  {name:24} best {min(values):7.3f} ms, median {statistics.median(values):7.3f} ms")
    return {name: min(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when every guard check meets its target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    print(load_average())
    with tempfile.TemporaryDirectory() as tmp:
        root, staging, data = build_node(Path(tmp), args.entries)
        table = MountTable(data)
        refs = search_mount_points(table, staging)
        print(f"{args.entries} mounts; SearchMountPoints refs of the staging path: {len(refs)}")

        # Each call gets a fresh MountTable over the same bytes (free: it keeps the bytes),
        # so nothing one call learned about the table helps the next.
        def guard(policy: str, detach: bool) -> Callable[[], UnmountVerdict]:
            return lambda: check_unmount_device(
                staging, root_dir=str(root), policy=policy, detach_follows=detach,
                table=MountTable(data),
            )

        checks = {
            "safe": guard("safe", False),
            "safe, detach follows": guard("safe", True),
            "kubelet": guard("kubelet", False),
        }
        for name, check in checks.items():
            verdict = check()
            print(f"{name}: {len(verdict.refs)} references, allowed={verdict.allowed}")
        times = interleaved(
            {"reference": lambda: search_mount_points(MountTable(data), staging), **checks},
            args.rounds,
        )
    ok = True
    for name in checks:
        row = Row(
            work=f"unstage guard ({name}), {args.entries} mounts",
            unit="ms",
            kubevol=times[name],
            reference=times["reference"],
            reference_name="its SearchMountPoints",
            max_ratio=2.0,
        )
        emit(row)
        ok = ok and row.met
    print(load_average())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
