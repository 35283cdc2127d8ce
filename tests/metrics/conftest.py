"""Real trees, mounts and devices for the metrics tests, each removed by its fixture."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubevol.metrics.walk import native_available


def sh(*cmd: str) -> str:
    """Run ``cmd``; its stdout. Fails the test, with stderr, if it exits non-zero."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


def gnu_du(path: Path) -> tuple[int, int]:
    """(bytes, inodes) of ``path`` by GNU du on one filesystem: ``-x -s -B1`` and ``--inodes``."""
    used = int(sh("du", "-x", "-s", "-B1", str(path)).split()[0])
    inodes = int(sh("du", "-x", "-s", "--inodes", str(path)).split()[0])
    return used, inodes


def make_tree(root: Path) -> None:
    """A tree with what du must handle: nesting, sizes around a block, hard links, a sparse
    file, symlinks (to a dir, dangling, a loop, to an ancestor), an empty dir and a FIFO."""
    deep = root / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for i, size in enumerate((0, 1, 4095, 4096, 4097, 100_000)):
        (root / "a" / f"f{i}").write_bytes(b"x" * size)
        (deep / f"g{i}").write_bytes(b"y" * size)
    (root / "x").mkdir()
    os.link(root / "a" / "f5", root / "a" / "b" / "link-1")
    os.link(root / "a" / "f5", root / "x" / "link-2")
    with open(root / "x" / "sparse", "wb") as f:
        f.truncate(50 * 1024 * 1024)
        f.seek(10 * 1024 * 1024)
        f.write(b"z")
    os.symlink("a", root / "to-dir")
    os.symlink("nowhere", root / "dangling")
    os.symlink("loop-2", root / "loop-1")
    os.symlink("loop-1", root / "loop-2")
    os.symlink("..", deep / "up")
    (root / "empty").mkdir()
    os.mkfifo(root / "x" / "fifo")
    bulk = root / "bulk"
    bulk.mkdir()
    for i in range(300):
        (bulk / f"n{i:03d}").write_bytes(b"n" * (i * 37))


@pytest.fixture(name="sh")
def sh_fixture() -> Callable[..., str]:
    """:func:`sh`: run a command, fail the test if it fails, return its stdout."""
    return sh


@pytest.fixture(name="gnu_du")
def gnu_du_fixture() -> Callable[[Path], tuple[int, int]]:
    """:func:`gnu_du`: GNU du's (bytes, inodes) of a path on one filesystem."""
    return gnu_du


@pytest.fixture(name="make_tree")
def make_tree_fixture() -> Callable[[Path], None]:
    """:func:`make_tree`: fill a directory with the tree every du test uses."""
    return make_tree


#: The walker implementations this build has: the Python one always, the C one when built.
# The native walker is built by every install of kubevol (pyproject's ext-modules), so it
# is always tested; a missing build is a failure here, not a quietly smaller test run.
assert native_available(), "kubevol.metrics._duwalk is not built: reinstall with pip install -e ."
IMPLEMENTATIONS = ("python", "native")


@pytest.fixture(params=IMPLEMENTATIONS)
def native(request: pytest.FixtureRequest) -> bool:
    """Each du walker implementation in turn (``True``: the C walker)."""
    return bool(request.param == "native")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A fresh tree made by :func:`make_tree`."""
    root = tmp_path / "tree"
    root.mkdir()
    make_tree(root)
    return root


Mounter = Callable[..., Path]


@pytest.fixture
def mount_tmpfs() -> Iterator[Mounter]:
    """Mount a tmpfs at a directory (created if needed); every one is unmounted at the end."""
    mounted: list[Path] = []

    def mount(target: Path, size: str = "16m", nr_inodes: str = "4k") -> Path:
        target.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes={nr_inodes}", "tmpfs", str(target))
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        sh("umount", str(target))


@pytest.fixture
def loop_image(tmp_path: Path) -> Iterator[Callable[[int], tuple[Path, str]]]:
    """Attach a sparse image of the given size to a loop device: (image, device)."""
    devices: list[str] = []

    def attach(size: int) -> tuple[Path, str]:
        image = tmp_path / f"disk{len(devices)}.img"
        with open(image, "wb") as f:
            f.truncate(size)
        device = sh("losetup", "-f", "--show", str(image)).strip()
        devices.append(device)
        return image, device

    yield attach
    for device in devices:
        sh("losetup", "-d", device)


#: How to make each filesystem quietly and over whatever the image held.
_MKFS = {"ext4": ("mkfs.ext4", "-q", "-F"), "xfs": ("mkfs.xfs", "-q", "-f")}


@pytest.fixture
def loop_fs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Make and mount an ext4 or xfs filesystem on a loop device; unmount and detach at the end.

    Raises ``OSError`` (after detaching the device) if the kernel refuses the mount.
    """
    made: list[tuple[Path, str]] = []

    def make(
        fstype: str = "ext4",
        *,
        name: str = "fs",
        size: int = 64 * 1024 * 1024,
        mkfs_opts: tuple[str, ...] = (),
        mount_opts: str = "",
    ) -> Path:
        image = tmp_path / f"{name}.img"
        with open(image, "wb") as f:
            f.truncate(size)
        sh(*_MKFS[fstype], *mkfs_opts, str(image))
        device = sh("losetup", "-f", "--show", str(image)).strip()
        target = tmp_path / name
        target.mkdir()
        opts = ["-o", mount_opts] if mount_opts else []
        proc = subprocess.run(
            ["mount", "-t", fstype, *opts, device, str(target)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            sh("losetup", "-d", device)
            raise OSError(f"mount -o {mount_opts or 'defaults'} {device}: {proc.stderr.strip()}")
        made.append((target, device))
        return target

    yield make
    for target, device in reversed(made):
        sh("umount", str(target))
        sh("losetup", "-d", device)


@pytest.fixture
def dead_fuse_mount(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Bind ``target`` with bindfs, then kill bindfs: ``target`` answers ENOTCONN from then on.

    This is a real unreadable entry as root, which bypasses permission bits. The mount is
    lazily unmounted at the end.
    """
    mounts: list[tuple[Path, subprocess.Popen[bytes]]] = []

    def make(target: Path) -> Path:
        source = tmp_path / f"bindfs-source-{len(mounts)}"
        source.mkdir()
        (source / "file").write_bytes(b"data")
        target.mkdir(parents=True, exist_ok=True)
        before = os.stat(target).st_dev
        # attr_timeout=0: the kernel must ask the (dead) daemon, not answer from its cache.
        proc = subprocess.Popen(["bindfs", "-f", "-o", "attr_timeout=0", str(source), str(target)])
        mounts.append((target, proc))
        deadline = time.monotonic() + 10
        while os.stat(target).st_dev == before:
            assert time.monotonic() < deadline, "bindfs did not mount"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return target

    yield make
    for target, proc in mounts:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sh("umount", "-l", str(target))
