"""Covers kubevol.plugins.local.

Local PersistentVolumes on real mounts: the bind mount, fsGroup on the first mount only,
read-only, node affinity, block mode through a loop device, and reconstruction from the
mount table."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol import MounterArgs, NodeVolumeHost, Spec, VolumeOptions, VolumePluginMgr
from kubevol.errors import OperationError, SpecError
from kubevol.mount import map_block_device, parse_mountinfo, unmap_block_device
from kubevol.plugins import LocalVolumePlugin
from kubevol.plugins.local import node_affinity_matches
from kubevol.spec import api_object
from kubevol.testing.mount_rig import MountRig


def make_pod(uid: str) -> Any:
    return api_object("V1Pod", {"metadata": {"name": uid, "namespace": "ns", "uid": uid}})


def local_pv(path: str, *, name: str = "local-pv", mode: str = "Filesystem",
             affinity: list[dict[str, Any]] | None = None, read_only: bool = False) -> Spec:
    spec: dict[str, Any] = {"local": {"path": path}, "volumeMode": mode,
                            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}
    if affinity is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": affinity}}
    pv = api_object("V1PersistentVolume", {"metadata": {"name": name}, "spec": spec})
    return Spec.from_persistent_volume(pv, read_only=read_only)


@pytest.fixture
def plugin(node_root: Path) -> LocalVolumePlugin:
    host = NodeVolumeHost(root_dir=str(node_root), node_name="node-1",
                          node_labels={"zone": "a", "disk": "ssd"})
    p = LocalVolumePlugin()
    VolumePluginMgr().init_plugins([p], host=host)
    return p


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """The local volume's directory, on a tmpfs of its own (a disk of the node)."""
    rig = MountRig(tmp_path / "rig")
    d = rig.tmpfs(tmp_path / "disk")
    try:
        yield d
    finally:
        rig.cleanup()


def mounted(path: str) -> bool:
    return any(m.mount_point == path for m in parse_mountinfo())


@pytest.mark.root
def test_bind_mount_and_tear_down(plugin: LocalVolumePlugin, disk: Path, node_root: Path) -> None:
    """The path is bound at the kubelet's pod path; tear-down unmounts and removes it."""
    (disk / "data.txt").write_text("hello")
    m = plugin.new_mounter(local_pv(str(disk)), make_pod("p1"), VolumeOptions())
    path = node_root / "pods/p1/volumes/kubernetes.io~local-volume/local-pv"
    assert m.get_path() == str(path)
    m.set_up(MounterArgs())
    m.set_up(MounterArgs())  # idempotent
    assert mounted(str(path))
    assert (path / "data.txt").read_text() == "hello"
    plugin.new_unmounter("local-pv", "p1").tear_down()
    assert not mounted(str(path))
    assert not path.exists()
    assert (disk / "data.txt").exists()


@pytest.mark.root
def test_fs_group_only_on_the_first_mount(plugin: LocalVolumePlugin, disk: Path) -> None:
    """The first pod's fsGroup is applied; a second pod's is not (the kubelet warns)."""
    (disk / "f").write_text("x")
    first = plugin.new_mounter(local_pv(str(disk)), make_pod("p1"), VolumeOptions())
    first.set_up(MounterArgs(fs_group=3000))
    assert (disk / "f").stat().st_gid == 3000
    assert stat.S_IMODE((disk / "f").stat().st_mode) & 0o660 == 0o660
    second = plugin.new_mounter(local_pv(str(disk)), make_pod("p2"), VolumeOptions())
    second.set_up(MounterArgs(fs_group=4000))
    assert (disk / "f").stat().st_gid == 3000
    for uid in ("p1", "p2"):
        plugin.new_unmounter("local-pv", uid).tear_down()


@pytest.mark.root
def test_read_only_bind(plugin: LocalVolumePlugin, disk: Path) -> None:
    """A read-only PV spec gives a read-only bind."""
    m = plugin.new_mounter(local_pv(str(disk), read_only=True), make_pod("p1"), VolumeOptions())
    m.set_up(MounterArgs())
    try:
        with pytest.raises(OSError, match="Read-only"):
            Path(m.get_path(), "new").write_text("x")
    finally:
        plugin.new_unmounter("local-pv", "p1").tear_down()


@pytest.mark.root
def test_node_affinity_is_checked(plugin: LocalVolumePlugin, disk: Path) -> None:
    """A PV pinned to another node is refused before anything is mounted."""
    other = [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                    "values": ["node-2"]}]}]
    m = None
    with pytest.raises(OperationError, match="not available on node 'node-1'"):
        m = plugin.new_mounter(local_pv(str(disk), affinity=other), make_pod("p1"),
                               VolumeOptions())
    assert m is None
    ours = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                  {"key": "disk", "operator": "Exists"}]}]
    plugin.new_mounter(local_pv(str(disk), affinity=ours), make_pod("p1"), VolumeOptions())


@pytest.mark.parametrize(
    ("terms", "matches"),
    [
        ([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}], True),
        ([{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}]}], True),
        ([{"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["3"]}]}], False),
        ([{"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}], True),
        ([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}],
         True),
        ([{}, {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}], False),
        ([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
          {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}], True),
    ],
)
def test_node_selector_semantics(terms: list[dict[str, Any]], matches: bool) -> None:
    """Terms ORed, expressions ANDed, each operator; an empty term matches nothing."""
    pv = local_pv("/x", affinity=terms).persistent_volume
    assert node_affinity_matches(pv, "node-1", {"zone": "a", "gen": "5"}) is matches


def test_bad_paths_are_refused(plugin: LocalVolumePlugin) -> None:
    """An empty or ``..`` path: the kubelet's errors, nothing mounted."""
    for path, message in (("", "path is empty"), ("/a/../etc", "must not contain '..'")):
        m = plugin.new_mounter(local_pv(path), make_pod("p1"), VolumeOptions())
        with pytest.raises(SpecError, match=message):
            m.set_up(MounterArgs())
        assert not os.path.exists(m.get_path())


@pytest.mark.root
def test_reconstruction_recovers_the_local_path(plugin: LocalVolumePlugin, disk: Path) -> None:
    """From the mount table alone, the rebuilt PV names the bound directory."""
    sub = disk / "vol1"
    sub.mkdir()
    m = plugin.new_mounter(local_pv(str(sub)), make_pod("p1"), VolumeOptions())
    m.set_up(MounterArgs())
    try:
        rebuilt = plugin.construct_volume_spec("local-pv", m.get_path()).spec
        assert rebuilt.persistent_volume.spec.local.path == str(sub)
        assert rebuilt.persistent_volume.spec.volume_mode == "Filesystem"
        assert plugin.can_support(rebuilt)
    finally:
        plugin.new_unmounter("local-pv", "p1").tear_down()
    gone = plugin.construct_volume_spec("local-pv", m.get_path()).spec
    assert gone.persistent_volume.spec.local.path == ""


@pytest.mark.root
def test_block_mode_maps_the_device(plugin: LocalVolumePlugin, tmp_path: Path,
                                    node_root: Path) -> None:
    """Block mode: the local path is the device; mapped at the kubelet's paths."""
    (tmp_path / "rig").mkdir()
    rig = MountRig(tmp_path / "rig")
    try:
        device = rig.loop(rig.image(ext4=False, size_mib=8))
        spec = local_pv(device, mode="Block")
        mapper = plugin.new_block_volume_mapper(spec, make_pod("p1"), VolumeOptions())
        assert mapper.set_up_device() == ""
        assert mapper.map_pod_device() == device
        global_map = mapper.get_global_map_path(spec)
        assert global_map == str(node_root / "plugins/kubernetes.io/local-volume/volumeDevices"
                                 / "local-pv")
        map_dir, link = mapper.get_pod_device_map_path()
        assert map_dir == str(node_root / "pods/p1/volumeDevices/kubernetes.io~local-volume")
        mounter = plugin.host.get_mounter()
        map_block_device(mounter, device_path=device, global_map_path=global_map,
                         pod_device_dir=map_dir, volume_map_name=link, pod_uid="p1")
        assert os.readlink(os.path.join(map_dir, link)) == device
        unmap_block_device(mounter, global_map_path=global_map, pod_device_dir=map_dir,
                           volume_map_name=link, pod_uid="p1")
        rebuilt = plugin.construct_block_volume_spec("p1", "local-pv", map_dir)
        assert rebuilt.persistent_volume.spec.volume_mode == "Block"
        not_block = plugin.new_block_volume_mapper(local_pv(str(tmp_path), mode="Block"),
                                                   make_pod("p1"), VolumeOptions())
        with pytest.raises(OperationError, match="not a block device"):
            not_block.map_pod_device()
    finally:
        rig.cleanup()
