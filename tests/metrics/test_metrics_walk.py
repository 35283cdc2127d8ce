"""Covers kubevol.metrics.walk.

The du walker (both implementations) against GNU du on real trees and real mounts.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kubevol.errors import MetricsError, MetricsErrorCode
from kubevol.metrics import walk as walk_module
from kubevol.metrics.walk import native_available, walk

Mounter = Callable[..., Path]
Sh = Callable[..., str]
Du = Callable[[Path], tuple[int, int]]


def test_figures_match_gnu_du(tree: Path, native: bool, gnu_du: Du) -> None:
    """Bytes and inodes equal ``du -x -s -B1`` / ``--inodes`` on a tree with hard links,
    a sparse file, symlink loops and a FIFO."""
    usage = walk(str(tree), native=native)
    assert (usage.bytes, usage.inodes) == gnu_du(tree)
    assert usage.source == "walk"


def test_hard_linked_inode_counted_once(tmp_path: Path, native: bool, gnu_du: Du) -> None:
    """Three names of one 100 kB file add its blocks and one inode once."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "one").write_bytes(b"a" * 100_000)
    base = walk(str(tmp_path / "t"), native=native)
    os.link(tmp_path / "t" / "one", tmp_path / "t" / "two")
    os.mkdir(tmp_path / "t" / "d")
    os.link(tmp_path / "t" / "one", tmp_path / "t" / "d" / "three")
    after = walk(str(tmp_path / "t"), native=native)
    dir_blocks = os.lstat(tmp_path / "t" / "d").st_blocks * 512
    assert after.inodes == base.inodes + 1  # only the new directory
    assert after.bytes == base.bytes + dir_blocks
    assert (after.bytes, after.inodes) == gnu_du(tmp_path / "t")


def test_sparse_file_counts_allocated_blocks_only(
    tmp_path: Path, native: bool, gnu_du: Du, sh: Sh
) -> None:
    """A 1 GiB sparse file with one written byte counts its allocated blocks, as ``stat`` says."""
    root = tmp_path / "sparse"
    root.mkdir()
    with open(root / "big", "wb") as f:
        f.truncate(1 << 30)
        f.write(b"1")
    usage = walk(str(root), native=native)
    blocks = int(sh("stat", "-c", "%b", str(root)).strip()) + int(
        sh("stat", "-c", "%b", str(root / "big")).strip()
    )
    assert usage.bytes == blocks * 512 < 1 << 20
    assert (usage.bytes, usage.inodes) == gnu_du(root)


@pytest.mark.root
def test_nested_mount_is_skipped(
    tree: Path, native: bool, mount_tmpfs: Mounter, gnu_du: Du
) -> None:
    """A tmpfs mounted inside the tree (with files in it) adds nothing, as with ``du -x``."""
    (tree / "a" / "b" / "mnt").mkdir()
    unmounted = walk(str(tree), native=native)
    mnt = mount_tmpfs(tree / "a" / "b" / "mnt")
    for i in range(20):
        (mnt / f"m{i}").write_bytes(b"m" * 50_000)
    usage = walk(str(tree), native=native)
    assert (usage.bytes, usage.inodes) == gnu_du(tree)
    # The mount hides the empty mount-point directory, which no longer counts either.
    assert usage.inodes == unmounted.inodes - 1


@pytest.mark.root
def test_root_on_its_own_mount_is_measured(
    tmp_path: Path,
    native: bool,
    mount_tmpfs: Mounter,
    gnu_du: Du,
    make_tree: Callable[[Path], None],
) -> None:
    """Measuring a mount point measures that filesystem (the root's device is the reference)."""
    mnt = mount_tmpfs(tmp_path / "vol")
    make_tree(mnt)
    usage = walk(str(mnt), native=native)
    assert (usage.bytes, usage.inodes) == gnu_du(mnt)


@pytest.mark.root
def test_bind_mount_cycle_terminates(tmp_path: Path, native: bool, sh: Sh) -> None:
    """A same-filesystem bind mount of the root inside itself is counted once, not forever."""
    root = tmp_path / "cyc"
    (root / "sub" / "loop").mkdir(parents=True)
    (root / "sub" / "f").write_bytes(b"f" * 10_000)
    before = walk(str(root), native=native)
    sh("mount", "--bind", str(root), str(root / "sub" / "loop"))
    try:
        during = walk(str(root), native=native)
    finally:
        sh("umount", str(root / "sub" / "loop"))
    # The covered "loop" directory disappears; the bound root is the root again: seen.
    assert during.inodes == before.inodes - 1


def test_symlinks_are_counted_not_followed(tmp_path: Path, native: bool, gnu_du: Du) -> None:
    """Links to an ancestor, to a big directory and in a loop count one inode each."""
    root = tmp_path / "links"
    (root / "d").mkdir(parents=True)
    big = tmp_path / "outside"
    big.mkdir()
    (big / "huge").write_bytes(b"h" * 1_000_000)
    base = walk(str(root), native=native)
    os.symlink("..", root / "d" / "up")
    os.symlink(big, root / "out")
    os.symlink("l2", root / "l1")
    os.symlink("l1", root / "l2")
    usage = walk(str(root), native=native)
    assert usage.inodes == base.inodes + 4
    assert usage.bytes < base.bytes + 1_000_000
    assert (usage.bytes, usage.inodes) == gnu_du(root)


def test_root_symlink_to_directory_is_followed(tree: Path, tmp_path: Path, native: bool) -> None:
    """A root path that is a symlink to a directory measures that directory."""
    os.symlink(tree, tmp_path / "alias")
    assert walk(str(tmp_path / "alias"), native=native) == walk(str(tree), native=native)


def test_threads_do_not_change_the_figures(tree: Path, gnu_du: Du) -> None:
    """The C walker gives the same figures on 1, 2 and 7 threads (and Python agrees)."""
    expected = walk(str(tree), native=False)
    if native_available():
        for threads in (1, 2, 7):
            assert walk(str(tree), native=True, threads=threads) == expected
    assert (expected.bytes, expected.inodes) == gnu_du(tree)


@pytest.mark.parametrize(
    ("make_path", "err"),
    [
        (lambda p: p / "missing", errno.ENOENT),
        (lambda p: p / "file", errno.ENOTDIR),
        (lambda p: p / "self-loop", errno.ELOOP),
    ],
    ids=["missing", "file", "symlink-loop"],
)
def test_bad_root_raises_fs_info_failed(
    tmp_path: Path, native: bool, make_path: Callable[[Path], Path], err: int
) -> None:
    """A missing root, a file, or a symlink loop raises FS_INFO_FAILED naming the path."""
    (tmp_path / "file").write_bytes(b"data")
    os.symlink("self-loop", tmp_path / "self-loop")
    path = make_path(tmp_path)
    with pytest.raises(MetricsError) as info:
        walk(str(path), native=native)
    assert info.value.code is MetricsErrorCode.FS_INFO_FAILED
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == err


@pytest.mark.root
def test_unreadable_entry_raises_naming_it(
    tree: Path, native: bool, dead_fuse_mount: Callable[[Path], Path]
) -> None:
    """A dead FUSE mount in the tree (ENOTCONN) fails the walk, naming that path."""
    dead = dead_fuse_mount(tree / "a" / "b" / "dead")
    with pytest.raises(MetricsError) as info:
        walk(str(tree), native=native)
    assert info.value.code is MetricsErrorCode.FS_INFO_FAILED
    assert str(dead) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOTCONN


def test_entry_deleted_between_listing_and_stat_is_ignored(
    tree: Path, monkeypatch: pytest.MonkeyPatch, gnu_du: Du
) -> None:
    """A file removed after its directory was listed, before its stat, is simply not counted."""
    victim = str(tree / "a" / "f5")
    real_lstat = os.lstat

    def lstat_after_delete(path: str) -> os.stat_result:
        if path == victim and os.path.lexists(path):
            os.unlink(path)
        return real_lstat(path)

    monkeypatch.setattr(walk_module, "_lstat", lstat_after_delete)
    usage = walk(str(tree), native=False)
    assert not os.path.lexists(victim)
    assert (usage.bytes, usage.inodes) == gnu_du(tree)


def test_directory_deleted_before_listing_is_ignored(
    tree: Path, monkeypatch: pytest.MonkeyPatch, gnu_du: Du
) -> None:
    """A directory removed after it was found, before it was listed, adds only its stat."""
    victim = str(tree / "a" / "b")
    real_listdir = os.listdir

    def listdir_after_delete(path: str) -> list[str]:
        if path == victim and os.path.exists(path):
            shutil.rmtree(path)
        return real_listdir(path)

    monkeypatch.setattr(walk_module, "_listdir", listdir_after_delete)
    usage = walk(str(tree), native=False)
    # The directory itself was stat'ed before it vanished, so it still counts once.
    assert usage.inodes == gnu_du(tree)[1] + 1


def test_concurrent_churn_never_fails(tree: Path, native: bool) -> None:
    """Files and directories created and deleted during walks never make a walk fail."""
    churn = tree / "churn"
    churn.mkdir()
    stop = threading.Event()
    errors: list[BaseException] = []

    def mutate() -> None:
        i = 0
        while not stop.is_set():
            d = churn / f"d{i % 7}"
            try:
                d.mkdir(exist_ok=True)
                (d / "f").write_bytes(b"c" * 5000)
                os.link(d / "f", d / "g")
                shutil.rmtree(d)
            except OSError as exc:  # our own races (rmtree vs mkdir) are not the test
                if exc.errno not in (errno.ENOENT, errno.EEXIST):
                    errors.append(exc)
            i += 1

    thread = threading.Thread(target=mutate)
    thread.start()
    try:
        static = walk(str(tree), native=native)
        for _ in range(40):
            usage = walk(str(tree), native=native)
            assert usage.inodes >= static.inodes - 30
    finally:
        stop.set()
        thread.join()
    assert not errors


@pytest.mark.parametrize("threads", [0, -1, 65])
def test_native_walker_rejects_bad_thread_counts(tree: Path, threads: int) -> None:
    """The C walker refuses thread counts outside [1, 64] instead of misbehaving."""
    if not native_available():  # the Python walker ignores ``threads``: nothing to refuse
        assert walk(str(tree), native=False, threads=threads).inodes > 0
        return
    with pytest.raises(ValueError, match="threads must be in"):
        walk(str(tree), native=True, threads=threads)
