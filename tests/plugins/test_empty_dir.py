"""Covers kubevol.plugins.empty_dir.

emptyDir plugin: disk and memory media on real directories and real tmpfs mounts.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from kubevol import (
    MetricsError,
    MounterArgs,
    MountError,
    NodeVolumeHost,
    Spec,
    SpecError,
    VolumeOptions,
    VolumePluginMgr,
    is_not_supported,
)
from kubevol.errors import UnsafePathError
from kubevol.mount import parse_mountinfo
from kubevol.plugins import EmptyDirPlugin
from tests.hostile import snapshot

UID = "pod-uid-1"


def pod(uid: str = UID) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name="p", namespace="default", uid=uid))


def ed_spec(name: str = "scratch", medium: str | None = None, size: str | None = None) -> Spec:
    source = client.V1EmptyDirVolumeSource(medium=medium, size_limit=size)
    return Spec.from_volume(client.V1Volume(name=name, empty_dir=source))


@pytest.fixture
def plugin(host: NodeVolumeHost) -> EmptyDirPlugin:
    p = EmptyDirPlugin()
    VolumePluginMgr().init_plugins([p], host=host)
    return p


def mount_of(path: str) -> list[str]:
    return [m.fs_type for m in parse_mountinfo() if m.mount_point == path]


def test_disk_medium_set_up_layout_and_idempotence(
    plugin: EmptyDirPlugin, node_root: Path
) -> None:
    """Set-up makes a world-writable dir at the kubelet path and a ready marker; twice is fine."""
    mounter = plugin.new_mounter(ed_spec(), pod(), VolumeOptions())
    path = node_root / "pods" / UID / "volumes" / "kubernetes.io~empty-dir" / "scratch"
    assert mounter.get_path() == str(path)
    mounter.set_up(MounterArgs())
    assert path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o777
    ready = node_root / "pods" / UID / "plugins" / "kubernetes.io~empty-dir" / "scratch" / "ready"
    assert ready.is_file()
    (path / "data").write_text("kept")
    mounter.set_up(MounterArgs())
    assert (path / "data").read_text() == "kept"
    assert mount_of(str(path)) == []


def test_disk_medium_tear_down_removes_everything(plugin: EmptyDirPlugin, node_root: Path) -> None:
    """Tear-down removes the directory, its contents and the ready marker; again is a no-op."""
    mounter = plugin.new_mounter(ed_spec(), pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    (Path(mounter.get_path()) / "d").mkdir()
    (Path(mounter.get_path()) / "d" / "f").write_text("x")
    unmounter = plugin.new_unmounter("scratch", UID)
    unmounter.tear_down()
    assert not os.path.exists(mounter.get_path())
    plugin_dir = node_root / "pods" / UID / "plugins" / "kubernetes.io~empty-dir"
    assert not (plugin_dir / "scratch").exists()
    unmounter.tear_down()


@pytest.mark.root
def test_fs_group_applied(plugin: EmptyDirPlugin) -> None:
    """fsGroup gives the volume the group and setgid."""
    mounter = plugin.new_mounter(ed_spec(), pod(), VolumeOptions())
    mounter.set_up(MounterArgs(fs_group=3456))
    st = os.stat(mounter.get_path())
    assert st.st_gid == 3456 and st.st_mode & stat.S_ISGID


@pytest.mark.root
def test_memory_medium_mounts_sized_tmpfs(plugin: EmptyDirPlugin) -> None:
    """Medium Memory mounts a tmpfs sized by sizeLimit; tear-down unmounts and removes it."""
    mounter = plugin.new_mounter(ed_spec(medium="Memory", size="8Mi"), pod(), VolumeOptions())
    path = mounter.get_path()
    mounter.set_up(MounterArgs())
    try:
        assert mount_of(path) == ["tmpfs"]
        assert os.statvfs(path).f_blocks * os.statvfs(path).f_frsize == 8 * 1024 * 1024
        mounter.set_up(MounterArgs())  # idempotent: still one mount
        assert mount_of(path) == ["tmpfs"]
        (Path(path) / "f").write_text("in memory")
        metrics = mounter.get_metrics()
        assert metrics.capacity == 8 * 1024 * 1024
        assert metrics.used is not None and metrics.used > 0
        rebuilt = plugin.construct_volume_spec("scratch", path)
        assert rebuilt.spec.volume.empty_dir.medium == "Memory"
    finally:
        plugin.new_unmounter("scratch", UID).tear_down()
    assert mount_of(path) == []
    assert not os.path.exists(path)


@pytest.mark.root
def test_tear_down_never_deletes_through_a_nested_mount(
    plugin: EmptyDirPlugin, tmp_path: Path
) -> None:
    """A foreign mount inside a disk emptyDir stops tear-down before anything is deleted."""
    mounter = plugin.new_mounter(ed_spec(), pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    inner = Path(mounter.get_path()) / "inner"
    inner.mkdir()
    (Path(mounter.get_path()) / "mine").write_text("x")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inner)], check=True)
    try:
        (inner / "theirs").write_text("y")
        with pytest.raises(MountError, match="is a mount point"):
            plugin.new_unmounter("scratch", UID).tear_down()
        assert (inner / "theirs").read_text() == "y"
        assert (Path(mounter.get_path()) / "mine").read_text() == "x"
    finally:
        subprocess.run(["umount", str(inner)], check=True)
    plugin.new_unmounter("scratch", UID).tear_down()
    assert not os.path.exists(mounter.get_path())


def test_disk_metrics_use_du(plugin: EmptyDirPlugin) -> None:
    """A disk emptyDir is measured by du: its own bytes and inodes."""
    mounter = plugin.new_mounter(ed_spec(), pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    (Path(mounter.get_path()) / "f").write_bytes(b"x" * 100_000)
    metrics = mounter.get_metrics()
    assert metrics.inodes_used == 2
    assert metrics.used is not None and metrics.used >= 100_000
    plugin.new_unmounter("scratch", UID).tear_down()
    with pytest.raises(MetricsError):
        mounter.get_metrics()


def test_unknown_medium_and_missing_uid_are_refused(plugin: EmptyDirPlugin) -> None:
    """Unsupported media and pods without a UID give clear errors."""
    with pytest.raises(SpecError, match="medium 'HugePages'"):
        plugin.new_mounter(ed_spec(medium="HugePages"), pod(), VolumeOptions())
    with pytest.raises(SpecError, match=r"no metadata\.uid"):
        no_uid = client.V1Pod(metadata=client.V1ObjectMeta())
        plugin.new_mounter(ed_spec(), no_uid, VolumeOptions())
    with pytest.raises(SpecError, match="not a valid quantity"):
        plugin.new_mounter(ed_spec(medium="Memory", size="lots"), pod(), VolumeOptions())


def test_construct_volume_spec_disk(plugin: EmptyDirPlugin, tmp_path: Path) -> None:
    """A plain directory reconstructs as a disk emptyDir the plugin supports."""
    rebuilt = plugin.construct_volume_spec("scratch", str(tmp_path))
    assert plugin.can_support(rebuilt.spec)
    assert rebuilt.spec.volume.empty_dir.medium is None
    assert rebuilt.spec.name() == "scratch"


def test_construct_volume_spec_of_a_vanished_directory_is_disk(
    plugin: EmptyDirPlugin, tmp_path: Path
) -> None:
    """A volume directory gone (or a file in its place) reconstructs as a disk emptyDir
    rather than failing: there is no tmpfs to find there."""
    rebuilt = plugin.construct_volume_spec("gone", str(tmp_path / "gone"))
    assert rebuilt.spec.volume.empty_dir.medium is None
    (tmp_path / "file").write_text("x")
    rebuilt = plugin.construct_volume_spec("file", str(tmp_path / "file" / "sub"))
    assert rebuilt.spec.volume.empty_dir.medium is None


def test_hostpath_metrics_not_supported() -> None:
    """hostPath volumes report not-supported, as the kubelet's nil provider."""
    from kubevol.plugins import HostPathPlugin

    spec = Spec.from_volume(
        client.V1Volume(name="h", host_path=client.V1HostPathVolumeSource(path="/"))
    )
    with pytest.raises(MetricsError) as info:
        HostPathPlugin().new_mounter(spec, None, VolumeOptions()).get_metrics()
    assert is_not_supported(info.value)


@pytest.mark.root
def test_tear_down_unmounts_a_dead_fuse_mount(plugin: EmptyDirPlugin, tmp_path: Path) -> None:
    """A corrupted mount (bindfs whose daemon was killed) is unmounted and removed."""
    mounter = plugin.new_mounter(ed_spec(), pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    source = tmp_path / "fuse-source"
    source.mkdir()
    (source / "kept").write_text("source data")
    path = mounter.get_path()
    subprocess.run(["bindfs", "-o", "attr_timeout=0", str(source), path], check=True)
    daemon = subprocess.run(
        ["pgrep", "-f", f"bindfs -o attr_timeout=0 {source} {path}"],
        capture_output=True, text=True, check=True,
    )
    for pid in daemon.stdout.split():
        os.kill(int(pid), 9)
    try:
        with pytest.raises(OSError):
            os.stat(path)
        plugin.new_unmounter("scratch", UID).tear_down()
        assert mount_of(path) == []
        assert not os.path.lexists(path)
        assert (source / "kept").read_text() == "source data"
    finally:
        if mount_of(path):
            subprocess.run(["umount", "-l", path], check=False)


@pytest.mark.parametrize("where", ["volume", "pod"])
def test_tear_down_refuses_a_link_at_the_volume_or_pod_directory(
    plugin: EmptyDirPlugin, node_root: Path, tmp_path: Path, where: str
) -> None:
    """The volume's directory (or the pod's) a link to a directory outside the root: tear-down
    raises UnsafePathError and nothing outside changes (issue 20, point 2)."""
    victim = tmp_path / "victim"
    (victim / "volumes" / "kubernetes.io~empty-dir" / "scratch").mkdir(parents=True)
    (victim / "precious").write_text("keep")
    (victim / "volumes" / "kubernetes.io~empty-dir" / "scratch" / "data").write_text("keep")
    before = snapshot(victim)
    pod_dir = node_root / "pods" / UID
    if where == "pod":
        pod_dir.parent.mkdir(parents=True)
        pod_dir.symlink_to(victim)
    else:
        (pod_dir / "volumes" / "kubernetes.io~empty-dir").mkdir(parents=True)
        (pod_dir / "volumes" / "kubernetes.io~empty-dir" / "scratch").symlink_to(victim)
    unmounter = plugin.new_unmounter("scratch", UID)
    with pytest.raises(UnsafePathError):
        unmounter.tear_down()
    with pytest.raises(UnsafePathError):
        plugin.new_mounter(ed_spec(), pod(), VolumeOptions()).set_up(MounterArgs())
    assert snapshot(victim) == before
