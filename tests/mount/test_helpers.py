"""Covers kubevol.mount.helpers.

path_exists, corrupted-mount detection and cleanup_mount_point on real mounts.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.errors import CorruptedMountError, MountError
from kubevol.mount import (
    LinuxMounter,
    cleanup_mount_point,
    is_corrupted_error,
    is_corrupted_mount,
    path_exists,
)
from kubevol.testing import FakeMounter
from kubevol.testing.mount_rig import MountRig, mounted_at


@pytest.fixture
def mounter() -> Iterator[LinuxMounter]:
    """A real mounter."""
    m = LinuxMounter()
    try:
        yield m
    finally:
        m.close()


def test_path_exists(tmp_path: Path) -> None:
    """True for an existing path, False for a missing one."""
    assert path_exists(str(tmp_path))
    assert not path_exists(str(tmp_path / "missing"))


@pytest.mark.root
def test_corrupted_mount_is_told_apart(rig: MountRig, tmp_path: Path) -> None:
    """A FUSE mount whose daemon died: path_exists raises CorruptedMountError (ENOTCONN),
    is_corrupted_mount is True; a healthy path is not corrupted."""
    broken = rig.corrupted(tmp_path / "fuse")
    with pytest.raises(CorruptedMountError) as info:
        path_exists(str(broken))
    assert is_corrupted_error(info.value)
    assert str(broken) in str(info.value)
    assert is_corrupted_mount(str(broken))
    assert not is_corrupted_mount(str(tmp_path))
    assert not is_corrupted_mount(str(tmp_path / "missing"))


@pytest.mark.root
def test_cleanup_unmounts_and_removes(rig: MountRig, mounter: LinuxMounter, tmp_path: Path) -> None:
    """A mounted directory is unmounted, re-checked and removed."""
    target = rig.tmpfs(tmp_path / "vol")
    (target / "data").write_text("on the tmpfs")
    cleanup_mount_point(str(target), mounter)
    assert not mounted_at(target)
    assert not target.exists()


@pytest.mark.root
def test_cleanup_of_corrupted_mount(rig: MountRig, mounter: LinuxMounter, tmp_path: Path) -> None:
    """A corrupted mount is unmounted and its directory removed."""
    broken = rig.corrupted(tmp_path / "fuse")
    cleanup_mount_point(str(broken), mounter)
    assert not mounted_at(broken)
    assert not broken.exists()


def test_cleanup_is_idempotent(mounter: LinuxMounter, tmp_path: Path) -> None:
    """A missing path is success; a plain empty directory is removed."""
    cleanup_mount_point(str(tmp_path / "missing"), mounter)
    (tmp_path / "empty").mkdir()
    cleanup_mount_point(str(tmp_path / "empty"), mounter)
    assert not (tmp_path / "empty").exists()


def test_cleanup_never_deletes_recursively(mounter: LinuxMounter, tmp_path: Path) -> None:
    """A non-mounted directory with files is left as it was, with an error naming it."""
    target = tmp_path / "vol"
    target.mkdir()
    (target / "precious").write_text("keep me")
    with pytest.raises(MountError, match="left in place"):
        cleanup_mount_point(str(target), mounter)
    assert (target / "precious").read_text() == "keep me"


@pytest.mark.root
def test_failed_unmount_leaves_every_file(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path
) -> None:
    """When the unmount fails (busy mount), cleanup raises and the data stays in place."""
    target = rig.tmpfs(tmp_path / "vol")
    (target / "precious").write_text("keep me")
    busy = subprocess.Popen(["sleep", "60"], cwd=target)
    try:
        with pytest.raises(MountError):
            cleanup_mount_point(str(target), mounter)
        assert mounted_at(target)
        assert (target / "precious").read_text() == "keep me"
    finally:
        busy.kill()
        busy.wait()


def test_cleanup_with_fake_mounter_stops_when_unmount_fails(tmp_path: Path) -> None:
    """With an injected unmount error the directory is not touched (logic test)."""
    target = tmp_path / "vol"
    target.mkdir()
    fake = FakeMounter()
    fake.mount("dev", str(target), "ext4")
    fake.unmount_errors[str(target)] = MountError("device busy")
    with pytest.raises(MountError, match="busy"):
        cleanup_mount_point(str(target), fake)
    assert target.is_dir()
    assert [a.action for a in fake.log] == ["mount", "unmount"]


def test_cleanup_extensive_check_uses_the_table(tmp_path: Path) -> None:
    """extensive_check asks is_mount_point, so a bind the fast check misses is unmounted."""
    target = tmp_path / "vol"
    target.mkdir()
    fake = FakeMounter()
    fake.mount("/src", str(target), "", ["bind"])
    cleanup_mount_point(str(target), fake, extensive_check=True)
    assert fake.list() == []
    assert not target.exists()
