"""Covers kubevol.mount.mountwatch and kubevol.mount.table.

Mount events (fanotify, Linux 6.15+) and the mount table cache's ``superset`` tables, on
real mounts in the test's private mount namespace."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.mount.mountwatch import AttachWatch
from kubevol.mount.table import MountTableCache
from kubevol.testing.mount_rig import MountRig


def _kernel_has_mount_events() -> bool:
    """fanotify mount events came with Linux 6.15 (fanotify: notify on mount attach and
    detach)."""
    match = re.match(r"(\d+)\.(\d+)", os.uname().release)
    assert match is not None
    return (int(match[1]), int(match[2])) >= (6, 15)


@pytest.fixture
def watch() -> Iterator[AttachWatch]:
    """A watch on the test's mount namespace; fails on a kernel without mount events."""
    opened = AttachWatch.open()
    if not _kernel_has_mount_events():
        assert opened is None
        pytest.fail(f"this kernel ({os.uname().release}) has no mount events to test")
    assert opened is not None, "a kernel with mount events refused the watch (as root)"
    with opened:
        yield opened


def _dirs(base: Path, *names: str) -> list[Path]:
    out = []
    for name in names:
        (base / name).mkdir()
        out.append(base / name)
    return out


@pytest.mark.root
def test_attach_and_move_are_reported_detach_is_not(
    watch: AttachWatch, rig: MountRig, tmp_path: Path
) -> None:
    source, a, b = _dirs(tmp_path, "source", "a", "b")
    assert not watch.attached()
    rig.bind(source, a)
    assert watch.attached()
    assert not watch.attached()  # taken: reported once
    subprocess.run(["mount", "--move", str(a), str(b)], check=True)
    assert watch.attached()  # moved: it is now listed somewhere else
    subprocess.run(["mount", "--move", str(b), str(a)], check=True)
    assert watch.attached()
    rig.unmount(a)
    assert not watch.attached()


@pytest.mark.root
def test_a_superset_table_is_kept_while_mounts_only_go(
    watch: AttachWatch, rig: MountRig, tmp_path: Path
) -> None:  # watch: the kernel has mount events
    """Only detaches since the read: the superset caller gets the same table, which still
    lists the detached mount, and nothing is read; an exact caller gets a fresh read."""
    source, a = _dirs(tmp_path, "source", "a")
    rig.bind(source, a)
    with MountTableCache() as cache:
        before = cache.table(superset=True)
        reads = cache.reads
        rig.unmount(a)
        kept = cache.table(superset=True)
        assert kept is before and cache.reads == reads
        assert kept.find_mount_point(str(a)) is not None
        fresh = cache.table()
        assert cache.reads == reads + 1 and fresh.find_mount_point(str(a)) is None
        # The fresh read is the superset callers' table from now on.
        assert cache.table(superset=True) is fresh


@pytest.mark.root
def test_a_superset_table_is_read_again_after_an_attach(
    watch: AttachWatch, rig: MountRig, tmp_path: Path
) -> None:  # watch: the kernel has mount events
    source, a = _dirs(tmp_path, "source", "a")
    with MountTableCache() as cache:
        before = cache.table(superset=True)
        rig.bind(source, a)
        after = cache.table(superset=True)
        assert after is not before and after.find_mount_point(str(a)) is not None


@pytest.mark.root
def test_without_mount_events_a_superset_table_is_an_exact_one(
    rig: MountRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older kernel, or a process that may not watch: every change means a read."""
    monkeypatch.setattr(AttachWatch, "open", classmethod(lambda cls: None))
    source, a = _dirs(tmp_path, "source", "a")
    rig.bind(source, a)
    with MountTableCache() as cache:
        before = cache.table(superset=True)
        rig.unmount(a)
        after = cache.table(superset=True)
        assert after is not before and after.find_mount_point(str(a)) is None


def test_a_fixture_file_gets_no_superset_table(tmp_path: Path) -> None:
    """Mount events speak of this process's namespace, not of a mountinfo file given."""
    path = tmp_path / "mountinfo"
    path.write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")
    with MountTableCache(str(path)) as cache:
        before = cache.table(superset=True)
        path.write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:5 / /a rw - tmpfs t rw\n")
        assert cache.table(superset=True) is not before
        assert cache._watch is None


@pytest.mark.root
def test_a_removed_mount_point_leaves_the_superset_table_without_a_read(
    watch: AttachWatch, rig: MountRig, tmp_path: Path
) -> None:  # watch: the kernel has mount events
    """A driver's unmount is learnt from the removal of its directory: the table held for
    superset callers leaves out what it listed there, and nothing is read."""
    source, a, b = _dirs(tmp_path, "source", "a", "b")
    rig.bind(source, a)
    rig.bind(source, a)  # stacked: every line at the removed mount point goes
    rig.bind(source, b)
    with MountTableCache() as cache:
        before = cache.table(superset=True)
        reads = cache.reads
        rig.unmount(a)
        rig.unmount(a)
        with cache.removing(str(a)):
            a.rmdir()
        after = cache.table(superset=True)
        assert cache.reads == reads
        assert after.derived_from == (before, frozenset({str(a)}))
        assert after.find_mount_point(str(a)) is None
        assert after.find_mount_point(str(b)) is not None
        assert len(after.entries()) == len(before.entries()) - 2
        assert cache.table(superset=True) is after


@pytest.mark.root
def test_a_table_read_after_the_removal_began_is_taken_as_read(
    watch: AttachWatch, rig: MountRig, tmp_path: Path
) -> None:  # watch: the kernel has mount events
    """Something mounted at the path again once it was removed, and a table read since,
    lists it: the removal's news must not take it out of that table."""
    source, a = _dirs(tmp_path, "source", "a")
    rig.bind(source, a)
    with MountTableCache() as cache:
        cache.table(superset=True)
        rig.unmount(a)
        with cache.removing(str(a)):
            a.rmdir()
            a.mkdir()
            rig.bind(source, a)
            assert cache.table(superset=True).find_mount_point(str(a)) is not None
        assert cache.table(superset=True).find_mount_point(str(a)) is not None
