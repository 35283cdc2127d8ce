"""Covers kubevol.util.fdtree.

fdtree.open_dir below a trusted directory: the kernel's one-call walk (openat2) and the
component-by-component walk it falls back to."""

from __future__ import annotations

import ctypes
import errno
import os
import types
from pathlib import Path
from typing import Any

import pytest

from kubevol.errors import UnsafePathError
from kubevol.util import fdtree


def _same_dir(fd: int, path: Path) -> bool:
    st, want = os.fstat(fd), path.stat()
    return (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino)


def test_a_plain_path_is_opened_by_the_kernel_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No component is opened one by one when openat2 does the walk."""
    target = tmp_path / "root" / "pods" / "uid" / "volumes"
    target.mkdir(parents=True)

    def no_walk(*args: object) -> int:
        raise AssertionError("walked component by component")

    monkeypatch.setattr(fdtree, "_open_sub", no_walk)
    fd = fdtree.open_dir(str(target), beneath=str(tmp_path / "root"))
    try:
        assert _same_dir(fd, target)
    finally:
        os.close(fd)


@pytest.mark.parametrize("usable", [True, False], ids=["openat2", "walk"])
def test_a_link_on_the_way_is_refused_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usable: bool
) -> None:
    """A link at any component below ``beneath`` is refused with the walk's precise error,
    whichever way the path is opened; a link above ``beneath`` is trusted."""
    monkeypatch.setattr(fdtree._Openat2, "usable", usable)
    outside = tmp_path / "outside"
    (outside / "volumes").mkdir(parents=True)
    (tmp_path / "real-root" / "pods").mkdir(parents=True)
    (tmp_path / "root").symlink_to(tmp_path / "real-root")  # above beneath: trusted
    (tmp_path / "real-root" / "pods" / "uid").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"pods/uid' is a symbolic link"):
        fdtree.open_dir(str(tmp_path / "root" / "pods" / "uid" / "volumes"),
                        beneath=str(tmp_path / "root"))
    (tmp_path / "real-root" / "pods" / "uid").unlink()
    (tmp_path / "real-root" / "pods" / "uid" / "volumes").mkdir(parents=True)
    fd = fdtree.open_dir(str(tmp_path / "root" / "pods" / "uid" / "volumes"),
                         beneath=str(tmp_path / "root"))
    try:
        assert _same_dir(fd, tmp_path / "real-root" / "pods" / "uid" / "volumes")
    finally:
        os.close(fd)


def test_a_kernel_without_openat2_is_asked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSYS (a kernel before 5.6, or a seccomp filter's answer) makes every later open
    walk component by component without asking the kernel again."""
    target = tmp_path / "root" / "a" / "b"
    target.mkdir(parents=True)
    monkeypatch.setattr(fdtree._Openat2, "usable", True)
    calls = 0

    def missing(*args: Any) -> int:
        nonlocal calls
        calls += 1
        ctypes.set_errno(errno.ENOSYS)
        return -1

    monkeypatch.setattr(fdtree, "libc", lambda: types.SimpleNamespace(syscall=missing))
    for _ in range(3):
        fd = fdtree.open_dir(str(target), beneath=str(tmp_path / "root"))
        try:
            assert _same_dir(fd, target)
        finally:
            os.close(fd)
    assert calls == 1
    assert not fdtree._Openat2.usable
