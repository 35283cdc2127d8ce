"""Covers kubevol.mount.linux.

LinuxMounter on real mounts: mount, bind + remount, sensitive options, unmount, checks.
"""

from __future__ import annotations

import errno
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.errors import MountError
from kubevol.mount import LinuxMounter, parse_mountinfo, syscalls
from kubevol.testing.mount_rig import MountRig, mounted_at


@pytest.fixture
def mounter(rig: MountRig) -> Iterator[LinuxMounter]:
    """A LinuxMounter whose mounts the rig removes if a test leaves any."""
    m = LinuxMounter()
    try:
        yield m
    finally:
        m.close()


def track(rig: MountRig, target: Path) -> None:
    """Let the rig unmount ``target`` if the test fails before doing it."""
    rig._mounts.append(target)


@pytest.mark.root
def test_mount_and_unmount_tmpfs(rig: MountRig, mounter: LinuxMounter, tmp_path: Path) -> None:
    """mount() puts a tmpfs in the table with its options; unmount() takes it out."""
    target = tmp_path / "t"
    target.mkdir()
    track(rig, target)
    mounter.mount("tmpfs", str(target), "tmpfs", ["size=1m", "mode=0700"])
    [entry] = [e for e in parse_mountinfo() if e.mount_point == str(target)]
    assert entry.fs_type == "tmpfs"
    assert "size=1024k" in entry.super_options
    assert mounter.is_mount_point(str(target))
    assert not mounter.is_likely_not_mount_point(str(target))
    assert any(mp.path == str(target) and mp.type == "tmpfs" for mp in mounter.list())
    mounter.unmount(str(target))
    assert not mounted_at(target)
    assert mounter.is_likely_not_mount_point(str(target))


@pytest.mark.root
def test_read_only_bind_is_bind_then_remount(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path
) -> None:
    """A bind with ro is read-only: the flag is applied by a remount of the bind."""
    source = rig.tmpfs(tmp_path / "src")
    target = tmp_path / "ro"
    target.mkdir()
    track(rig, target)
    mounter.mount(str(source), str(target), "", ["bind", "ro"])
    [entry] = [e for e in parse_mountinfo() if e.mount_point == str(target)]
    assert entry.options[0] == "ro"
    with pytest.raises(OSError) as info:
        (target / "f").write_text("x")
    assert info.value.errno == errno.EROFS
    (source / "f").write_text("still writable at the source")
    assert (target / "f").read_text() == "still writable at the source"


@pytest.mark.root
def test_bind_of_same_filesystem_is_seen_by_statx(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path
) -> None:
    """A bind of a directory of the same filesystem is detected (statx mount root), which a
    device-number comparison would miss."""
    (tmp_path / "a").mkdir()
    target = tmp_path / "b"
    target.mkdir()
    track(rig, target)
    mounter.mount(str(tmp_path / "a"), str(target), "", ["bind"])
    assert not mounter.is_likely_not_mount_point(str(target))
    assert mounter.is_likely_not_mount_point(str(tmp_path / "a"))


@pytest.mark.root
def test_is_likely_not_mount_point_raises_for_missing_path(
    mounter: LinuxMounter, tmp_path: Path
) -> None:
    """A missing path raises FileNotFoundError, as the interface promises."""
    with pytest.raises(FileNotFoundError):
        mounter.is_likely_not_mount_point(str(tmp_path / "missing"))


@pytest.mark.root
def test_failed_mount_never_shows_sensitive_options(
    mounter: LinuxMounter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing mount_sensitive masks the secret in the error and in the logs."""
    target = tmp_path / "t"
    target.mkdir()
    caplog.set_level(logging.DEBUG, logger="kubevol")
    with pytest.raises(MountError) as info:
        mounter.mount_sensitive(
            "tmpfs", str(target), "tmpfs", ["size=1m"], ["password=s3cr3t-value"]
        )
    assert "s3cr3t-value" not in str(info.value)
    assert "<masked>" in str(info.value)
    assert "s3cr3t-value" not in caplog.text
    assert "<masked>" in caplog.text
    assert not mounted_at(target)


@pytest.mark.root
def test_failed_mount_names_the_command(mounter: LinuxMounter, tmp_path: Path) -> None:
    """The error of a failed mount names the command, target and output."""
    with pytest.raises(MountError) as info:
        mounter.mount(str(tmp_path / "no-such-source"), str(tmp_path), "", ["bind"])
    assert str(tmp_path / "no-such-source") in str(info.value)
    assert "mount failed" in str(info.value)


@pytest.mark.root
def test_failed_remount_undoes_the_bind(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the remount step of a bind fails, the real bind is unmounted again: nothing is
    left half-done (a writable bind where a read-only one was asked for)."""
    source = rig.tmpfs(tmp_path / "src")
    target = tmp_path / "t"
    target.mkdir()
    track(rig, target)
    real_mount = syscalls.mount

    def refuse_remount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
        if flags & syscalls.MS_REMOUNT:  # the kernel rarely refuses one on demand
            raise OSError(errno.EPERM, "remount refused", target)
        real_mount(source, target, fstype, flags, data)

    monkeypatch.setattr(syscalls, "mount", refuse_remount)
    with pytest.raises(MountError, match="remount refused"):
        mounter.mount(str(source), str(target), "", ["bind", "ro"])
    assert not mounted_at(target)


@pytest.mark.root
def test_unmount_is_idempotent(mounter: LinuxMounter, rig: MountRig, tmp_path: Path) -> None:
    """Unmounting a directory that is not a mount point succeeds (the kubelet's safe
    "not mounted" behaviour); a missing path raises MountError naming it."""
    target = rig.tmpfs(tmp_path / "t")
    mounter.unmount(str(target))
    mounter.unmount(str(target))
    assert not mounted_at(target)
    with pytest.raises(MountError, match=str(tmp_path / "missing")):
        mounter.unmount(str(tmp_path / "missing"))


@pytest.mark.root
def test_bind_and_tmpfs_mounts_are_kernel_calls(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Binds, read-only binds, tmpfs and unmounts need no mount(8)/umount(8) process; a
    read-only bind keeps the per-mount flags it inherited from its source (nosuid)."""
    source = rig.mount("tmpfs", tmp_path / "src", "size=1m", "nosuid", fstype="tmpfs")

    def no_fork(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"forked {args}")

    monkeypatch.setattr(subprocess, "run", no_fork)
    bound = tmp_path / "bound"
    bound.mkdir()
    track(rig, bound)
    mounter.mount(str(source), str(bound), "", ["bind", "ro"])
    [entry] = [e for e in parse_mountinfo() if e.mount_point == str(bound)]
    assert "ro" in entry.options and "nosuid" in entry.options
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    track(rig, fresh)
    mounter.mount("tmpfs", str(fresh), "tmpfs", ["size=2m", "mode=0700", "noexec"])
    [entry] = [e for e in parse_mountinfo() if e.mount_point == str(fresh)]
    assert "noexec" in entry.options and "size=2048k" in entry.super_options
    for path in (bound, fresh):
        mounter.unmount(str(path))
        assert not mounted_at(path)


@pytest.mark.parametrize(
    ("fstype", "options", "direct"),
    [
        ("", ["bind"], True),
        ("", ["bind", "ro", "nosuid"], True),
        ("tmpfs", ["size=1m", "mode=0755", "defaults"], True),
        ("ext4", [], False),
        ("", ["bind", "remount", "ro"], False),
        ("", ["bind", "x-kubevol.option"], False),
        ("tmpfs", ["remount", "size=2m"], False),
        ("tmpfs", ["user"], False),
        ("nfs", ["vers=4"], False),
    ],
)
def test_only_kernel_only_requests_skip_mount8(
    fstype: str, options: list[str], direct: bool
) -> None:
    """mount(2) directly for binds and tmpfs with options the kernel understands; mount(8)
    for other filesystem types and for options only mount(8) interprets."""
    assert (syscalls.mount_call(fstype, options) is not None) is direct


@pytest.mark.root
def test_get_mount_refs_lists_other_mounts_of_the_same_root(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path
) -> None:
    """get_mount_refs: other mounts with the same root and device; sub-directory binds and
    other devices are not refs; a missing path gives []."""
    dev = rig.loop()
    a = rig.mount(dev, tmp_path / "a")
    b = rig.mount(dev, tmp_path / "b")
    (a / "sub").mkdir()
    rig.bind(a / "sub", tmp_path / "c")
    rig.tmpfs(tmp_path / "other")
    assert mounter.get_mount_refs(str(a)) == [str(b)]
    assert mounter.get_mount_refs(str(b)) == [str(a)]
    assert mounter.get_mount_refs(str(tmp_path / "gone")) == []


@pytest.mark.root
def test_get_mount_refs_of_a_corrupted_mount_is_empty(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path
) -> None:
    """A corrupted mount has no refs (Kubernetes treats it as unmounted)."""
    broken = rig.corrupted(tmp_path / "fuse")
    assert mounter.get_mount_refs(str(broken)) == []


@pytest.mark.root
def test_sensitive_options_reach_the_mount(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Sensitive options are passed to mount(8) (the size takes effect) but logged masked."""
    target = tmp_path / "t"
    target.mkdir()
    track(rig, target)
    caplog.set_level(logging.DEBUG, logger="kubevol")
    mounter.mount_sensitive("tmpfs", str(target), "tmpfs", ["mode=0700"], ["size=2m"])
    [entry] = [e for e in parse_mountinfo() if e.mount_point == str(target)]
    assert "size=2048k" in entry.super_options
    assert "size=2m" not in caplog.text
    assert "<masked>" in caplog.text


@pytest.mark.root
def test_device_number_fallback(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without statx's mount-root attribute, a mount of another filesystem is still found
    by comparing device numbers with the parent (a same-filesystem bind is not: documented)."""
    from kubevol.mount import linux

    monkeypatch.setattr(linux, "_statx_mount_root", lambda path: None)
    tmpfs = rig.tmpfs(tmp_path / "t")
    (tmp_path / "a").mkdir()
    bind = rig.bind(tmp_path / "a", tmp_path / "b")
    assert not mounter.is_likely_not_mount_point(str(tmpfs))
    assert mounter.is_likely_not_mount_point(str(bind))
    assert mounter.is_likely_not_mount_point(str(tmp_path / "a"))


@pytest.mark.root
def test_corrupted_mount_is_still_a_mount_point(
    rig: MountRig, mounter: LinuxMounter, tmp_path: Path
) -> None:
    """statx (AT_STATX_DONT_SYNC) answers from the cached inode, so a dead FUSE mount is
    reported as a mount point without waiting on the dead daemon; stat() gives ENOTCONN."""
    broken = rig.corrupted(tmp_path / "fuse")
    assert not mounter.is_likely_not_mount_point(str(broken))
    with pytest.raises(OSError) as info:
        broken.stat()
    assert info.value.errno == errno.ENOTCONN
