"""Covers kubevol.mount.mountread and kubevol.mount.table.

Reading the mount table while other mounts come and go: never an error, never a mount
that stayed missing, never a stale cached table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.errors import MountError
from kubevol.mount import LinuxMounter, MountTableCache, mountread, parse_mountinfo, syscalls
from kubevol.mount.mountread import read_mountinfo_bytes
from kubevol.mount.table import MountTable
from kubevol.testing.mount_churn import MountChurn
from kubevol.testing.mount_rig import MountRig

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

#: Enough mounts that the table spans many read(2) calls (one page each).
STABLE = 150


@pytest.fixture
def stable_mounts(rig: MountRig, tmp_path: Path) -> Iterator[list[str]]:
    """``STABLE`` tmpfs mounts that stay for the whole test."""
    points = []
    try:
        for i in range(STABLE):
            point = tmp_path / "stable" / str(i)
            point.mkdir(parents=True)
            syscalls.mount("stable", str(point), "tmpfs", 0, "size=64k")
            points.append(str(point))
        yield points
    finally:
        for mounted in reversed(points):
            syscalls.umount(mounted, syscalls.MNT_DETACH)


def lists_all(data: bytes, points: list[str]) -> bool:
    """Whether the mountinfo ``data`` has an entry at each of ``points``."""
    table = MountTable(data)
    return all(table.find_mount_point(p) is not None for p in points)


def test_reads_under_churn_never_fail_and_list_every_stable_mount(
    stable_mounts: list[str], tmp_path: Path
) -> None:
    """With tmpfs mounted and unmounted thousands of times a second, every read of a
    many-page table succeeds and lists every mount that stayed (Linux >= 5.8 cursor)."""
    assert len(read_mountinfo_bytes()) > 4 * 4096
    with MountTableCache() as cache, MountChurn(tmp_path / "churn") as churn:
        reads = 0
        deadline = time.monotonic() + 120
        # At least 100 reads of each kind and 100 churn rounds overlapping them, however
        # busy the machine (the churn thread may get little time).
        while reads < 100 or churn.cycles < 100:
            assert time.monotonic() < deadline, f"{reads} reads, {churn.cycles} churn rounds"
            assert lists_all(read_mountinfo_bytes(), stable_mounts)
            assert lists_all(cache.table().data, stable_mounts)
            entries = parse_mountinfo()
            assert {e.mount_point for e in entries} >= set(stable_mounts)
            reads += 1


def test_kernel_without_cursor_reads_until_a_pass_saw_no_change(
    stable_mounts: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a kernel before 5.8 only a read during which nothing changed is complete: the
    reader reads again until it gets one, so intermittent churn still never fails a read."""
    monkeypatch.setattr(mountread, "kernel_reads_mountinfo_with_cursor", lambda: False)
    with MountChurn(tmp_path / "churn", pause=0.002) as churn:
        for _ in range(30):
            assert lists_all(read_mountinfo_bytes(), stable_mounts)
        assert churn.cycles > 0


def test_cache_rereads_after_a_failed_read(
    rig: MountRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that fails after the change flag was consumed does not leave the old table
    cached: the next call reads again and sees the new mount."""
    with MountTableCache() as cache:
        cache.table()
        fresh = rig.tmpfs(tmp_path / "fresh")
        real_read = mountread.MountinfoReader._read_once
        failing = iter([True])

        def read_once(self: mountread.MountinfoReader) -> bytes:
            if next(failing, False):
                raise MountError("simulated read failure")
            return real_read(self)

        monkeypatch.setattr(mountread.MountinfoReader, "_read_once", read_once)
        with pytest.raises(MountError, match="simulated"):
            cache.table()
        assert cache.table().find_mount_point(str(fresh)) is not None


def test_mounter_checks_and_unmounts_under_churn(
    stable_mounts: list[str], rig: MountRig, tmp_path: Path
) -> None:
    """is_mount_point answers right and unmount succeeds while other mounts churn; a second
    unmount of the same path is a no-op, as the kubelet's is."""
    mounter = LinuxMounter()
    try:
        with MountChurn(tmp_path / "churn"):
            for i in range(50):
                target = tmp_path / "t" / str(i)
                target.mkdir(parents=True)
                mounter.mount("tmpfs", str(target), "tmpfs", ["size=64k"])
                assert mounter.is_mount_point(str(target))
                mounter.unmount(str(target))
                assert not mounter.is_mount_point(str(target))
                mounter.unmount(str(target))
    finally:
        mounter.close()
