"""Covers kubevol.testing.fake_mounter.

FakeMounter: records calls, keeps a table, injects errors, masks sensitive options.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubevol.errors import MountError
from kubevol.mount import MountInterface
from kubevol.testing import FakeAction, FakeMounter


def test_is_a_mounter() -> None:
    """FakeMounter implements MountInterface."""
    assert isinstance(FakeMounter(), MountInterface)


def test_records_mounts_and_unmounts() -> None:
    """Calls are recorded in order with their arguments; the table follows them."""
    fake = FakeMounter()
    fake.mount("/dev/sda", "/a", "ext4", ["rw"])
    fake.mount("/a", "/b", "", ["bind", "ro"])
    assert fake.is_mount_point("/b")
    fake.unmount("/b")
    assert fake.log == [
        FakeAction(action="mount", target="/a", source="/dev/sda", fstype="ext4", options=("rw",)),
        FakeAction(action="mount", target="/b", source="/a", options=("bind", "ro")),
        FakeAction(action="unmount", target="/b"),
    ]
    assert [mp.path for mp in fake.list()] == ["/a"]


def test_sensitive_options_are_masked() -> None:
    """Sensitive options appear only as <masked> in the record."""
    fake = FakeMounter()
    fake.mount_sensitive("//srv/share", "/m", "cifs", ["vers=3"], ["password=hunter2"])
    assert fake.log[0].options == ("vers=3", "<masked>")
    assert "hunter2" not in repr(fake.log) + repr(fake.list())


def test_unmount_of_unmounted_path_fails() -> None:
    """Unmounting a path that is not in the table raises MountError."""
    with pytest.raises(MountError):
        FakeMounter().unmount("/nothing")


def test_injected_errors() -> None:
    """Injected mount/unmount errors are raised and the table is left unchanged."""
    fake = FakeMounter()
    fake.mount_errors["/a"] = MountError("no")
    with pytest.raises(MountError):
        fake.mount("x", "/a")
    assert fake.list() == []


def test_refs_follow_the_bound_device() -> None:
    """A bind shares its source's device, so the two are each other's refs."""
    fake = FakeMounter()
    fake.mount("/dev/sda", "/a", "ext4")
    fake.mount("/a", "/b", "", ["bind"])
    fake.mount("/dev/sdb", "/c", "ext4")
    assert fake.get_mount_refs("/a") == ["/b"]
    assert fake.get_mount_refs("/c") == []


def test_is_likely_not_mount_point_needs_the_path(tmp_path: Path) -> None:
    """Like the real one: FileNotFoundError for a missing path, else table membership."""
    fake = FakeMounter()
    with pytest.raises(FileNotFoundError):
        fake.is_likely_not_mount_point(str(tmp_path / "missing"))
    assert fake.is_likely_not_mount_point(str(tmp_path))
    fake.mount("tmpfs", str(tmp_path), "tmpfs")
    assert not fake.is_likely_not_mount_point(str(tmp_path))
