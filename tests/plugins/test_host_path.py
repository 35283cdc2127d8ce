"""Covers kubevol.plugins.host_path.

hostPath plugin: type checks, set-up, provisioner, deleter and recycler on real files.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kubevol import (
    HostPathTypeError,
    KubevolError,
    MounterArgs,
    MountError,
    NodeVolumeHost,
    OperationError,
    Spec,
    VolumeOptions,
    VolumePluginMgr,
)
from kubevol.plugins import HostPathPlugin


def hp_spec(path: str, path_type: str | None = None) -> Spec:
    return Spec.from_volume(
        client.V1Volume(
            name="hp", host_path=client.V1HostPathVolumeSource(path=path, type=path_type)
        )
    )


@pytest.fixture
def plugin(host: NodeVolumeHost, tmp_path: Path) -> HostPathPlugin:
    p = HostPathPlugin(provisioning_dir=str(tmp_path / "provisioned"))
    (tmp_path / "provisioned").mkdir()
    VolumePluginMgr().init_plugins([p], host=host)
    return p


def set_up(plugin: HostPathPlugin, path: str, path_type: str | None) -> None:
    plugin.new_mounter(hp_spec(path, path_type), None, VolumeOptions()).set_up(MounterArgs())


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        yield path


def test_directory_or_create_creates_and_is_idempotent(
    plugin: HostPathPlugin, tmp_path: Path
) -> None:
    """DirectoryOrCreate makes the directory (0755) once and accepts it afterwards."""
    target = tmp_path / "made" / "deep"
    set_up(plugin, str(target), "DirectoryOrCreate")
    assert target.is_dir()
    assert target.stat().st_mode & 0o777 == 0o755
    set_up(plugin, str(target), "DirectoryOrCreate")


def test_file_or_create_creates_file(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """FileOrCreate creates an empty file; a missing parent is a clear error."""
    set_up(plugin, str(tmp_path / "f"), "FileOrCreate")
    assert (tmp_path / "f").is_file()
    with pytest.raises(HostPathTypeError, match="parent directory"):
        set_up(plugin, str(tmp_path / "nope" / "f"), "FileOrCreate")


def test_each_type_accepts_its_kind(
    plugin: HostPathPlugin, tmp_path: Path, unix_socket: str
) -> None:
    """Directory, File, Socket, CharDevice and BlockDevice accept real files of their kind."""
    (tmp_path / "file").write_text("x")
    loop = subprocess.run(["losetup", "-f"], capture_output=True, text=True, check=True)
    for path, kind in [
        (str(tmp_path), "Directory"),
        (str(tmp_path / "file"), "File"),
        (unix_socket, "Socket"),
        ("/dev/null", "CharDevice"),
        (loop.stdout.strip(), "BlockDevice"),
    ]:
        set_up(plugin, path, kind)


@pytest.mark.parametrize(
    ("kind", "found"),
    [
        ("Directory", "found a regular file"),
        ("Socket", "found a regular file"),
        ("CharDevice", "found a regular file"),
        ("BlockDevice", "found a regular file"),
    ],
)
def test_wrong_kind_says_what_was_found(
    plugin: HostPathPlugin, tmp_path: Path, kind: str, found: str
) -> None:
    """A type mismatch names the path, the type and what is there instead."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(HostPathTypeError, match=found) as info:
        set_up(plugin, str(tmp_path / "file"), kind)
    assert str(tmp_path / "file") in str(info.value)


def test_file_type_on_directory_and_missing(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """File on a directory says 'found a directory'; a missing path says it does not exist."""
    with pytest.raises(HostPathTypeError, match="found a directory"):
        set_up(plugin, str(tmp_path), "File")
    with pytest.raises(HostPathTypeError, match="does not exist"):
        set_up(plugin, str(tmp_path / "missing"), "Directory")
    with pytest.raises(HostPathTypeError, match="unknown type 'Dir'"):
        set_up(plugin, str(tmp_path), "Dir")


def test_untyped_path_is_not_checked(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """An empty type checks nothing, even for a missing path (as the kubelet)."""
    set_up(plugin, str(tmp_path / "missing"), None)
    assert not (tmp_path / "missing").exists()


def test_get_path_and_tear_down(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """The volume's path is the host path; tear-down leaves it in place."""
    (tmp_path / "keep").mkdir()
    mounter = plugin.new_mounter(hp_spec(str(tmp_path / "keep")), None, VolumeOptions())
    assert mounter.get_path() == str(tmp_path / "keep")
    mounter.tear_down()
    assert (tmp_path / "keep").is_dir()
    with pytest.raises(OperationError, match="does not make sense"):
        mounter.set_up_at("/elsewhere", MounterArgs())


def test_provision_then_delete(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """The provisioner makes a directory and a matching PV; the deleter removes it."""
    pvc = client.V1PersistentVolumeClaim(
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"],
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
        )
    )
    pv = plugin.new_provisioner(VolumeOptions(pv_name="pv-a", pvc=pvc)).provision()
    path = Path(pv.spec.host_path.path)
    assert path == tmp_path / "provisioned" / "pv-a"
    assert path.is_dir()
    assert pv.spec.capacity == {"storage": "1Gi"}
    (path / "data").write_text("x")
    spec = Spec.from_persistent_volume(pv)
    assert plugin.get_volume_name(spec) == str(path)
    plugin.new_deleter(spec).delete()
    assert not path.exists()


def test_deleter_refuses_outside_provisioning_dir(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """Deleting a path outside the provisioning directory is refused and deletes nothing."""
    (tmp_path / "precious").mkdir()
    with pytest.raises(OperationError, match="not inside the provisioning directory"):
        plugin.new_deleter(hp_spec(str(tmp_path / "precious"))).delete()
    with pytest.raises(OperationError):
        plugin.new_deleter(hp_spec(str(tmp_path / "provisioned" / ".." / "precious"))).delete()
    assert (tmp_path / "precious").is_dir()


@pytest.mark.root
def test_deleter_never_deletes_through_a_mount(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """A mount inside the volume stops the delete before anything is removed."""
    vol = tmp_path / "provisioned" / "pv-m"
    (vol / "mnt").mkdir(parents=True)
    (vol / "file").write_text("keep")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(vol / "mnt")], check=True)
    try:
        (vol / "mnt" / "other").write_text("not ours")
        with pytest.raises(MountError, match="is a mount point"):
            plugin.new_deleter(hp_spec(str(vol))).delete()
        assert (vol / "file").read_text() == "keep"
        assert (vol / "mnt" / "other").read_text() == "not ours"
    finally:
        subprocess.run(["umount", str(vol / "mnt")], check=True)


def test_recycle_empties_but_keeps_the_volume(plugin: HostPathPlugin, tmp_path: Path) -> None:
    """Recycling removes the contents, keeps the directory, and records an event."""
    vol = tmp_path / "provisioned" / "pv-r"
    (vol / "d" / "e").mkdir(parents=True)
    (vol / "d" / "e" / "f").write_text("x")
    (vol / "g").write_text("y")
    events: list[tuple[str, str]] = []
    plugin.recycle("pv-r", hp_spec(str(vol)), lambda kind, msg: events.append((kind, msg)))
    assert vol.is_dir() and os.listdir(vol) == []
    assert events and events[0][0] == "Normal" and "pv-r" in events[0][1]


def test_provisioning_disabled_without_dir(host: NodeVolumeHost) -> None:
    """Without a provisioning dir, provisioning is refused clearly."""
    p = HostPathPlugin()
    with pytest.raises(KubevolError, match="provisioning is disabled"):
        p.new_provisioner(VolumeOptions())


def test_construct_volume_spec_round_trips_path(plugin: HostPathPlugin) -> None:
    """A reconstructed spec is a hostPath volume the plugin supports."""
    rebuilt = plugin.construct_volume_spec("/srv/data", "/ignored")
    assert plugin.can_support(rebuilt.spec)
    assert plugin.get_volume_name(rebuilt.spec) == "/srv/data"
