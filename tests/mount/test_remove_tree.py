"""Covers kubevol.mount.helpers.

remove_tree_on_one_device: deletes a tree a workload can write without ever following a
link or crossing a mount, even while the workload swaps directories for links (issue 20,
points 1 and 2)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.errors import MountError, UnsafePathError
from kubevol.mount import helpers, remove_tree_on_one_device
from kubevol.testing.mount_rig import MountRig
from tests.hostile import LinkFlipper, snapshot


def make_victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    for i in range(20):
        (victim / f"precious-{i}").write_text(f"data {i}")
        (victim / "sub" / f"deep-{i}").write_text(f"deep {i}")
    return victim


def make_volume(root: Path, *, dirs: int = 40, files: int = 15) -> list[str]:
    names = []
    for d in range(dirs):
        sub = root / f"d{d}"
        (sub / "inner").mkdir(parents=True)
        for f in range(files):
            (sub / f"f{f}").write_text("x")
            (sub / "inner" / f"g{f}").write_text("y")
        names.append(sub.name)
    return names


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Let the racing thread run between almost every step of the removal."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def swapper(volume: Path, names: list[str], target: Path, stop: threading.Event) -> None:
    """What a hostile workload does: replace each sub-directory by a link to ``target``."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    while not stop.is_set():
        for name in names:
            # Through descriptors, so that the swapper itself never writes into ``target``.
            for parent, entry in ((str(volume), name), (f"{volume}/{name}.moved", "inner")):
                try:
                    fd = os.open(parent, flags)
                except OSError:
                    continue
                try:
                    os.rename(entry, f"{entry}.moved", src_dir_fd=fd, dst_dir_fd=fd)
                    os.symlink(target, entry, dir_fd=fd)
                except OSError:
                    pass
                finally:
                    os.close(fd)


@pytest.mark.slow
def test_racing_symlink_swaps_never_change_anything_outside_the_tree(
    tmp_path: Path, fast_switching: None
) -> None:
    """A thread swapping sub-directories for links to a directory outside the volume while
    the volume is deleted: every file outside stays, and the volume ends up deleted."""
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    for attempt in range(4):
        volume = tmp_path / f"volume-{attempt}"
        names = make_volume(volume)
        stop = threading.Event()
        thread = threading.Thread(target=swapper, args=(volume, names, victim, stop))
        thread.start()
        try:
            # The tree changing under the removal (ENOTEMPTY...) is fine: retried below.
            with contextlib.suppress(OSError):
                remove_tree_on_one_device(str(volume))
        finally:
            stop.set()
            thread.join()
        assert snapshot(victim) == before, f"attempt {attempt} changed files outside the tree"
        if volume.exists():
            remove_tree_on_one_device(str(volume))
        assert not os.path.lexists(volume)
    assert snapshot(victim) == before


@pytest.mark.slow
def test_a_workload_exchanging_directories_with_links_never_makes_it_delete_outside(
    tmp_path: Path,
) -> None:
    """A workload process atomically exchanging sub-directories with links to a directory
    outside (the name never goes missing) during the removal: nothing outside changes."""
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    for attempt in range(3):
        volume = tmp_path / f"volume-{attempt}"
        names = make_volume(volume, dirs=30, files=20)
        # The tree changing under the removal is fine: what matters is outside.
        with LinkFlipper(volume, victim, names), contextlib.suppress(OSError):
            remove_tree_on_one_device(str(volume))
        assert snapshot(victim) == before, f"attempt {attempt} changed files outside the tree"
        remove_tree_on_one_device(str(volume))
        assert not os.path.lexists(volume)


def test_links_inside_are_removed_not_followed(tmp_path: Path) -> None:
    """Links to files and directories outside are deleted as links."""
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    volume = tmp_path / "volume"
    (volume / "a").mkdir(parents=True)
    (volume / "a" / "to-dir").symlink_to(victim)
    (volume / "to-file").symlink_to(victim / "precious-1")
    (volume / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(volume / "fifo")
    remove_tree_on_one_device(str(volume))
    assert not volume.exists()
    assert snapshot(victim) == before


@pytest.mark.parametrize("where", ["top", "beneath"])
def test_a_link_where_the_directory_is_expected_changes_nothing(
    tmp_path: Path, where: str
) -> None:
    """A volume (or pod) directory that is a link to a directory outside: refused, the
    target and the link stay."""
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    root = tmp_path / "root"
    pods = root / "pods"
    pods.mkdir(parents=True)
    if where == "top":
        link = pods / "uid-1"
        link.symlink_to(victim)
        path = link
    else:
        (pods / "uid-1").symlink_to(victim)
        path = pods / "uid-1" / "sub"
    with pytest.raises(UnsafePathError, match="symbolic link"):
        remove_tree_on_one_device(str(path), beneath=str(root))
    assert snapshot(victim) == before
    assert (pods / "uid-1").is_symlink()


def test_a_path_outside_beneath_is_refused(tmp_path: Path) -> None:
    """``beneath`` is a containment check too."""
    (tmp_path / "root").mkdir()
    (tmp_path / "other").mkdir()
    with pytest.raises(UnsafePathError, match="not under"):
        remove_tree_on_one_device(str(tmp_path / "root" / ".." / "other"),
                                  beneath=str(tmp_path / "root"))
    assert (tmp_path / "other").is_dir()


def test_missing_path_raises_file_not_found(tmp_path: Path) -> None:
    """Callers tell "already gone" apart from a failure."""
    with pytest.raises(FileNotFoundError):
        remove_tree_on_one_device(str(tmp_path / "gone"))


@pytest.mark.slow
def test_a_tree_deeper_than_the_open_descriptor_window_is_removed(tmp_path: Path) -> None:
    """3,000 levels (made through descriptors, beyond PATH_MAX): no RecursionError, no
    descriptor exhaustion, everything removed."""
    volume = tmp_path / "volume"
    volume.mkdir()
    fd = os.open(volume, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(3000):
        os.mkdir("d", dir_fd=fd)
        with open(os.open(f"f{level % 3}", os.O_CREAT | os.O_WRONLY, dir_fd=fd), "w") as f:
            f.write("x")
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    open_before = _open_fds()
    remove_tree_on_one_device(str(volume))
    assert not volume.exists()
    assert _open_fds() == open_before


@pytest.mark.root
def test_a_mount_inside_refuses_before_deleting_anything(tmp_path: Path, rig: MountRig) -> None:
    """A tmpfs mounted below the volume: MountError, every file still there, and the walk
    that found the mount closed the directories it had kept."""
    volume = tmp_path / "volume"
    make_volume(volume, dirs=3, files=2)
    (volume / "z-mnt").mkdir()
    rig.tmpfs(volume / "z-mnt")
    (volume / "z-mnt" / "other-volume-data").write_text("keep")
    before = snapshot(volume)
    open_before = _open_fds()
    with pytest.raises(MountError, match="mount point"):
        remove_tree_on_one_device(str(volume))
    assert snapshot(volume) == before
    assert _open_fds() == open_before


@pytest.mark.root
def test_a_bind_mount_of_the_same_filesystem_is_detected(tmp_path: Path, rig: MountRig) -> None:
    """Same device number, other mount: told apart by the mount id."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    volume = tmp_path / "volume"
    (volume / "bound").mkdir(parents=True)
    rig.bind(outside, volume / "bound")
    assert (volume / "bound").stat().st_dev == volume.stat().st_dev
    with pytest.raises(MountError, match="mount point"):
        remove_tree_on_one_device(str(volume))
    assert (outside / "keep").read_text() == "keep"


def test_a_tree_walked_once_is_deleted_from_what_the_walk_kept(tmp_path: Path) -> None:
    """A small tree is deleted from the descriptors its one walk kept (no second walk):
    everything goes, and no descriptor is left open."""
    volume = tmp_path / "volume"
    make_volume(volume, dirs=5, files=4)
    (volume / "link").symlink_to(tmp_path)
    before = _open_fds()
    remove_tree_on_one_device(str(volume) + "/")
    assert not volume.exists()
    assert tmp_path.exists()
    assert _open_fds() == before


def test_a_tree_written_between_the_walk_and_the_deletion_is_walked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workload adds a file after the walk listed the tree: the directory holding it is not
    empty when its turn comes, and the tree is walked again and deleted all the same."""
    volume = tmp_path / "volume"
    make_volume(volume, dirs=3, files=2)
    walk_before_deleting = helpers._walk_before_deleting

    def then_written(top_fd: int, path: str, kept: dict[str, int]) -> object:
        listed = walk_before_deleting(top_fd, path, kept)
        (volume / "d0" / "written-meanwhile").write_text("x")
        return listed

    monkeypatch.setattr(helpers, "_walk_before_deleting", then_written)
    before = _open_fds()
    remove_tree_on_one_device(str(volume))
    assert not volume.exists()
    assert _open_fds() == before

