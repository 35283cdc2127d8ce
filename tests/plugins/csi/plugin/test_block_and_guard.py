"""Covers kubevol.plugins.csi.block and the unstage guard (kubevol.mount.guard).

Block volume lifecycle, and the unstage guard on the shared-superblock (Lustre) shape.
"""

from __future__ import annotations

import os
import stat

import pytest

from kubevol.csi import types as t
from kubevol.errors import DeviceStillMountedError
from kubevol.mount.guard import UnmountVerdict
from kubevol.plugins.csi import map_block_volume, unmap_block_volume
from kubevol.testing.mount_rig import mounts_under
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions
from tests.plugins.csi.plugin.csiplugin_driver import tree
from tests.plugins.csi.plugin.rig import (
    POD_UID,
    LoopDevices,
    Rig,
    RigFactory,
    make_pod,
    pv_spec,
)

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

BLOCK = "plugins/kubernetes.io/csi/volumeDevices"


@pytest.mark.parametrize("staged", [True, False])
def test_block_lifecycle_stages_publishes_maps_and_cleans_up(
    make_rig: RigFactory, loops: LoopDevices, staged: bool
) -> None:
    """A block PV: vol_data.json in volumeDevices/<spec>/data, NodeStage at staging/<spec>
    (only for a driver with STAGE_UNSTAGE), NodePublish (with that staging path) at
    publish/<spec>/<podUID>, the device mapped into the pod; data written through the pod's
    device reaches the loop device; teardown leaves only the kubelet's empty directories."""
    caps = {t.NodeCapability.STAGE_UNSTAGE_VOLUME} if staged else set()
    rig = make_rig(node_caps=caps)
    device = loops.make()
    spec = pv_spec("pv-b", "blk-1", block=True, fs_type="", attributes={"device": device})
    pod = make_pod()
    mapper = rig.plugin.new_block_volume_mapper(spec, pod, VolumeOptions())
    staging = mapper.set_up_device()
    publish = mapper.map_pod_device()
    root = rig.root
    assert staging == (str(root / BLOCK / "staging/pv-b") if staged else "")
    assert publish == str(root / BLOCK / f"publish/pv-b/{POD_UID}")
    assert stat.S_ISBLK(os.stat(publish).st_mode)
    global_map = mapper.get_global_map_path(spec)
    pod_dir, name = mapper.get_pod_device_map_path()
    assert global_map == str(root / BLOCK / "pv-b/dev")
    assert (pod_dir, name) == (str(root / f"pods/{POD_UID}/volumeDevices/kubernetes.io~csi"),
                               "pv-b")
    mounter = rig.host.get_mounter()
    map_block_volume(mounter, device_path=publish, global_map_path=global_map,
                     pod_device_dir=pod_dir, volume_map_name=name, pod_uid=POD_UID)
    staging_dirs = [f"{BLOCK}/staging/", f"{BLOCK}/staging/pv-b/"] if staged else []
    assert tree(root) == sorted([
        "plugins/", "plugins/kubernetes.io/", "plugins/kubernetes.io/csi/", f"{BLOCK}/",
        f"{BLOCK}/pv-b/", f"{BLOCK}/pv-b/data/", f"{BLOCK}/pv-b/data/vol_data.json",
        f"{BLOCK}/pv-b/dev/", f"{BLOCK}/pv-b/dev/{POD_UID}",
        f"{BLOCK}/publish/", f"{BLOCK}/publish/pv-b/", f"{BLOCK}/publish/pv-b/{POD_UID}",
        *staging_dirs,
        "pods/", f"pods/{POD_UID}/", f"pods/{POD_UID}/volumeDevices/",
        f"pods/{POD_UID}/volumeDevices/kubernetes.io~csi/",
        f"pods/{POD_UID}/volumeDevices/kubernetes.io~csi/pv-b",
    ])
    with open(os.path.join(pod_dir, name), "r+b") as f:
        f.write(b"kubevol-block")
    with open(device, "rb") as f:
        assert f.read(13) == b"kubevol-block"
    if staged:
        assert "block" in rig.driver.requests("NodeStageVolume")[0]["volume_capability"]
        assert rig.driver.requests("NodePublishVolume")[0]["staging_target_path"] == staging
    else:
        assert "staging_target_path" not in rig.driver.requests("NodePublishVolume")[0]

    unmap_block_volume(mounter, global_map_path=global_map, pod_device_dir=pod_dir,
                       volume_map_name=name, pod_uid=POD_UID)
    unmapper = rig.plugin.new_block_volume_unmapper("pv-b", POD_UID)
    unmapper.unmap_pod_device()
    unmapper.tear_down_device(global_map, publish)
    assert mounts_under(root) == []
    assert tree(root) == sorted([
        "plugins/", "plugins/kubernetes.io/", "plugins/kubernetes.io/csi/", f"{BLOCK}/",
        f"{BLOCK}/publish/", *staging_dirs[:1],
        "pods/", f"pods/{POD_UID}/", f"pods/{POD_UID}/volumeDevices/",
        f"pods/{POD_UID}/volumeDevices/kubernetes.io~csi/",
    ])
    expected = ["NodePublishVolume", "NodeUnpublishVolume"]
    if staged:
        expected = ["NodeStageVolume", *expected, "NodeUnstageVolume"]
    assert rig.driver.names() == expected


def _two_staged_volumes(rig: Rig) -> dict[str, tuple[str, str]]:
    """Stage and publish pv-a and pv-b (one pod each) from the shared filesystem."""
    out = {}
    for name, uid in (("pv-a", "pod-a-uid"), ("pv-b", "pod-b-uid")):
        spec = pv_spec(name, f"h-{name}")
        attacher = rig.plugin.new_attacher()
        dmp = attacher.get_device_mount_path(spec)
        attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
        mounter = rig.plugin.new_mounter(spec, make_pod(uid=uid), VolumeOptions())
        mounter.set_up(MounterArgs())
        out[name] = (dmp, mounter.get_path())
    return out


@pytest.mark.parametrize("policy", ["safe", "kubelet"])
def test_shared_superblock_unstage_safe_allows_kubelet_refuses(
    make_rig: RigFactory, loops: LoopDevices, policy: str
) -> None:
    """Two volumes staged from ONE filesystem (same device, root "/"): once pv-a's pod is gone,
    its unmount_device succeeds under ``safe`` (pv-b keeps working) and is refused under
    ``kubelet`` with the kubelet's message naming pv-b's global mount."""
    device = loops.make(32, ext4=True)
    rig = make_rig(shared_device=device, guard_policy=policy)
    vols = _two_staged_volumes(rig)
    (dmp_a, _), (dmp_b, pod_b) = vols["pv-a"], vols["pv-b"]
    rig.plugin.new_unmounter("pv-a", "pod-a-uid").tear_down()
    detacher = rig.plugin.new_detacher()
    # Kubernetes' GetMountRefs finds pv-b's global mount either way; the policy decides.
    assert rig.plugin.get_device_mount_refs(dmp_a) == [dmp_b]
    verdict = rig.plugin.device_unmount_verdict(dmp_a)
    assert blocking(verdict) == ([] if policy == "safe" else [dmp_b])
    if policy == "safe":
        detacher.unmount_device(dmp_a)
        assert not os.path.exists(dmp_a)
        assert dmp_a not in mounts_under(rig.root)
        with open(os.path.join(pod_b, "still-there"), "w") as f:
            f.write("yes")
        assert rig.driver.requests("NodeUnstageVolume")[0]["staging_target_path"] == dmp_a
    else:
        with pytest.raises(DeviceStillMountedError) as err:
            detacher.unmount_device(dmp_a)
        assert str(err.value) == (
            f'the device mount path "{dmp_a}" is still mounted by other references [{dmp_b}]'
        )
        assert err.value.refs == (dmp_b,)
        assert dmp_a in mounts_under(rig.root)
        assert rig.driver.requests("NodeUnstageVolume") == []
    rig.plugin.new_unmounter("pv-b", "pod-b-uid").tear_down()
    if policy == "safe":
        detacher.unmount_device(dmp_b)
        assert mounts_under(rig.root) == []
    else:
        # Kubernetes issue 105323: each global mount blocks the other's unstage for ever.
        with pytest.raises(DeviceStillMountedError):
            detacher.unmount_device(dmp_b)


def blocking(verdict: UnmountVerdict) -> list[str]:
    """The mount points that block the unmount, in the verdict's order."""
    return [r.mount_point for r in verdict.blocking_refs]


def test_device_mount_refs_count_this_volumes_pod_mounts(rig: Rig) -> None:
    """While a pod still publishes the volume, its global mount has that pod mount as a
    blocking reference and unmount_device is refused (nothing is unstaged), with or
    without the verdict handed in; once the pod mount is gone it is unstaged."""
    spec = pv_spec("pv-a", "h-1")
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    assert rig.plugin.get_device_mount_refs(dmp) == [mounter.get_path()]
    verdict = rig.plugin.device_unmount_verdict(dmp)
    assert blocking(verdict) == [mounter.get_path()]
    with pytest.raises(DeviceStillMountedError):
        attacher.unmount_device(dmp)
    with pytest.raises(DeviceStillMountedError):
        attacher.unmount_device(dmp, verdict=verdict)
    assert rig.driver.requests("NodeUnstageVolume") == []
    mounter.tear_down()
    attacher.unmount_device(dmp, verdict=rig.plugin.device_unmount_verdict(dmp))
    assert mounts_under(rig.root) == []


def test_unmount_device_refuses_a_verdict_about_another_path(rig: Rig) -> None:
    """A verdict handed to unmount_device must be about that device mount path: one about
    another volume's is refused and nothing is unstaged."""
    attacher = rig.plugin.new_attacher()
    dmps = []
    for name in ("pv-a", "pv-b"):
        spec = pv_spec(name, f"h-{name}")
        dmp = attacher.get_device_mount_path(spec)
        attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
        dmps.append(dmp)
    with pytest.raises(ValueError, match="verdict is about"):
        attacher.unmount_device(dmps[0], verdict=rig.plugin.device_unmount_verdict(dmps[1]))
    assert rig.driver.requests("NodeUnstageVolume") == []
    for dmp in dmps:
        attacher.unmount_device(dmp)
    assert mounts_under(rig.root) == []
