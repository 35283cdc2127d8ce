"""Covers kubevol.mount.format.

SafeFormatAndMount on real loop devices: format only blank devices, check before rw.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kubevol.errors import (
    FilesystemErrorsError,
    FilesystemMismatchError,
    UnformattedReadOnlyError,
)
from kubevol.mount import LinuxMounter, SafeFormatAndMount
from kubevol.mount.format import PARTITIONED
from kubevol.testing import FakeMounter
from kubevol.testing.mount_rig import MountRig, mounted_at, run


@pytest.fixture
def safe(rig: MountRig) -> Iterator[SafeFormatAndMount]:
    """SafeFormatAndMount over a real LinuxMounter."""
    mounter = LinuxMounter()
    try:
        yield SafeFormatAndMount(mounter)
    finally:
        mounter.close()


def blank_loop(rig: MountRig) -> str:
    """A loop device over a blank (all zero) image."""
    return rig.loop(rig.image("blank.img", ext4=False))


@pytest.mark.root
def test_blank_device_is_formatted_and_mounted(
    rig: MountRig, safe: SafeFormatAndMount, tmp_path: Path
) -> None:
    """A blank device gets ext4 (the default) and is mounted."""
    dev = blank_loop(rig)
    assert safe.get_disk_format(dev) == ""
    target = tmp_path / "t"
    target.mkdir()
    rig._mounts.append(target)
    safe.format_and_mount(dev, str(target))
    assert safe.get_disk_format(dev) == "ext4"
    assert mounted_at(target)


@pytest.mark.root
def test_blank_device_read_only_is_refused(
    rig: MountRig, safe: SafeFormatAndMount, tmp_path: Path
) -> None:
    """A blank device asked to mount read-only raises and stays blank."""
    dev = blank_loop(rig)
    with pytest.raises(UnformattedReadOnlyError):
        safe.format_and_mount(dev, str(tmp_path), "ext4", ["ro"])
    assert safe.get_disk_format(dev) == ""


@pytest.mark.root
def test_other_filesystem_is_never_reformatted(
    rig: MountRig, safe: SafeFormatAndMount, tmp_path: Path
) -> None:
    """A device holding ext4 asked for xfs raises FilesystemMismatchError, data intact."""
    dev = rig.loop()
    with pytest.raises(FilesystemMismatchError, match="ext4"):
        safe.format_and_mount(dev, str(tmp_path), "xfs")
    assert safe.get_disk_format(dev) == "ext4"


@pytest.mark.root
def test_existing_filesystem_is_kept_and_mounted(
    rig: MountRig, safe: SafeFormatAndMount, tmp_path: Path
) -> None:
    """A formatted device is fsck'd and mounted with its files, not formatted again."""
    dev = rig.loop()
    first = rig.mount(dev, tmp_path / "first")
    (first / "keep").write_text("data")
    rig.unmount(first)
    target = tmp_path / "t"
    target.mkdir()
    rig._mounts.append(target)
    safe.format_and_mount(dev, str(target), "ext4")
    assert (target / "keep").read_text() == "data"


@pytest.mark.root
def test_filesystem_errors_fail_a_read_write_mount(
    rig: MountRig, safe: SafeFormatAndMount, tmp_path: Path
) -> None:
    """An ext4 with a destroyed root inode: fsck -a exits 4 and the mount is refused."""
    image = rig.image("broken.img")
    run("debugfs", "-w", "-R", "clri <2>", str(image))
    run("debugfs", "-w", "-R", "ssv state 0", str(image))
    dev = rig.loop(image)
    with pytest.raises(FilesystemErrorsError):
        safe.format_and_mount(dev, str(tmp_path), "ext4")
    assert not mounted_at(tmp_path)


def write_mbr(image: Path) -> None:
    """Write a DOS partition table with one Linux partition from sector 2048 to the end."""
    sectors = image.stat().st_size // 512
    entry = bytes([0x00, 0, 0, 0, 0x83, 0, 0, 0])
    entry += (2048).to_bytes(4, "little") + (sectors - 2048).to_bytes(4, "little")
    with open(image, "r+b") as f:
        f.seek(446)
        f.write(entry)
        f.seek(510)
        f.write(b"\x55\xaa")


@pytest.mark.root
def test_partitioned_disk_is_not_formatted(
    rig: MountRig, safe: SafeFormatAndMount, tmp_path: Path
) -> None:
    """A disk with a partition table reports PARTITIONED and is never formatted."""
    image = rig.image("parted.img", ext4=False)
    write_mbr(image)
    dev = rig.loop(image)
    assert safe.get_disk_format(dev) == PARTITIONED
    with pytest.raises(FilesystemMismatchError):
        safe.format_and_mount(dev, str(tmp_path), "ext4")


class Script:
    """A scripted command runner: exit codes per program, every call recorded."""

    def __init__(self, codes: dict[str, int], stdout: dict[str, str]) -> None:
        self.codes = codes
        self.stdout = stdout
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(args))
        prog = args[0]
        return subprocess.CompletedProcess(
            list(args), self.codes.get(prog, 0), self.stdout.get(prog, ""), ""
        )


def test_mkfs_arguments_and_read_only_skips_fsck() -> None:
    """Logic: ext4 gets -F -m0 plus format options; a read-only mount of a formatted device
    runs no fsck."""
    blank = Script({"blkid": 2}, {})
    fake = FakeMounter()
    SafeFormatAndMount(fake, run=blank).format_and_mount(
        "/dev/x", "/t", "ext4", format_options=["-E", "nodiscard"]
    )
    assert blank.calls[1] == ["mkfs.ext4", "-F", "-m0", "-E", "nodiscard", "/dev/x"]
    formatted = Script({}, {"blkid": "TYPE=xfs\n"})
    SafeFormatAndMount(fake, run=formatted).format_and_mount("/dev/y", "/u", "", ["ro"])
    assert [c[0] for c in formatted.calls] == ["blkid"]
    assert fake.list()[-1].type == "xfs"


def test_fsck_corrected_errors_still_mount() -> None:
    """Logic: fsck exit 1 (errors corrected) mounts; exit 4 raises."""
    fake = FakeMounter()
    SafeFormatAndMount(fake, run=Script({"fsck": 1}, {"blkid": "TYPE=ext4\n"})).format_and_mount(
        "/dev/x", "/t"
    )
    assert fake.is_mount_point("/t")
    with pytest.raises(FilesystemErrorsError):
        SafeFormatAndMount(
            fake, run=Script({"fsck": 4}, {"blkid": "TYPE=ext4\n"})
        ).format_and_mount("/dev/x", "/u")
