"""Covers kubevol.plugins.csi end to end with kubevol.csidriver.drivers.hostpath.

End to end against the bundled hostpath driver on a unix socket: the plugin registered
through the plugin watcher, filesystem and block lifecycles with direct attachment, and the
shared-superblock (Lustre-shaped) unstage under both guard policies."""

from __future__ import annotations

import datetime
import json
import os
import stat
import time
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME as HP
from kubevol.errors import DeviceStillMountedError
from kubevol.layout import sha256_hex
from kubevol.mount.guard import GuardPolicy
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.plugins.csi import map_block_volume, unmap_block_volume
from kubevol.plugins.csi.registration import PluginWatcher, serve_registration
from kubevol.spec import Spec
from kubevol.testing.mount_rig import mounts_under
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions
from tests.plugins.csi.plugin.csiplugin_driver import tree
from tests.plugins.csi.plugin.rig import (
    HOSTPATH_NODE_ID,
    NODE_NAME,
    POD_UID,
    HostPathRig,
    HostPathRigFactory,
    make_pod,
    pv_spec,
)

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

MiB = 1 << 20
CSI_DIR = f"plugins/kubernetes.io/csi/{HP}"
BLOCK = "plugins/kubernetes.io/csi/volumeDevices"


def _create(rig: HostPathRig, name: str, *, block: bool = False) -> tuple[str, dict[str, str]]:
    cap = (t.VolumeCapability.block() if block
           else t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_WRITER))
    vol = rig.client.create_volume(name, [cap], capacity_range=t.CapacityRange(
        required_bytes=16 * MiB))
    return vol.volume_id, dict(vol.volume_context)


def _spec(name: str, handle: str, context: dict[str, str], *, block: bool = False) -> Spec:
    return pv_spec(name, handle, driver=HP, block=block, fs_type="" if block else "ext4",
                   attributes=context)


def _published_node_ids(rig: HostPathRig, handle: str) -> tuple[str, ...]:
    status = rig.client.controller_get_volume(handle).status
    return status.published_node_ids if status is not None else ()


def test_filesystem_lifecycle_with_direct_attachment(hostpath_rig: HostPathRigFactory) -> None:
    """Attach (ControllerPublishVolume to the driver's node id), stage, publish, write, then
    tear down and detach: the kubelet's exact files while in use, nothing but the kubelet's
    empty directories afterwards, and the driver no longer publishing the volume."""
    rig = hostpath_rig(enable_attach=True, attach_limit=4)
    handle, context = _create(rig, "pv-fs")
    spec = _spec("pv-fs", handle, context)
    attacher = rig.plugin.new_attacher()
    assert rig.plugin.can_attach(spec)
    attacher.attach(spec, NODE_NAME)
    assert _published_node_ids(rig, handle) == (HOSTPATH_NODE_ID,)
    attacher.wait_for_attach(spec, "", make_pod(), datetime.timedelta(seconds=5))
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs(fs_group=2000))
    pod_path = mounter.get_path()
    sha = sha256_hex(handle)
    pod_vol = f"pods/{POD_UID}/volumes/kubernetes.io~csi/pv-fs"
    assert dmp == str(rig.root / CSI_DIR / sha / "globalmount")
    assert mounts_under(rig.root) == [dmp, pod_path]
    assert tree(rig.root) == sorted([
        "plugins/", "plugins/kubernetes.io/", "plugins/kubernetes.io/csi/", f"{CSI_DIR}/",
        f"{CSI_DIR}/{sha}/", f"{CSI_DIR}/{sha}/globalmount/", f"{CSI_DIR}/{sha}/vol_data.json",
        "pods/", f"pods/{POD_UID}/", f"pods/{POD_UID}/volumes/",
        f"pods/{POD_UID}/volumes/kubernetes.io~csi/", f"{pod_vol}/", f"{pod_vol}/mount/",
        f"{pod_vol}/vol_data.json",
    ])
    assert json.loads((rig.root / pod_vol / "vol_data.json").read_text())["volumeHandle"] == handle
    Path(pod_path, "data").write_text("through the pod")
    assert Path(dmp, "data").read_text() == "through the pod"
    assert os.stat(pod_path).st_gid == 2000  # fsGroup applied by the plugin
    metrics = mounter.get_metrics()
    assert metrics.capacity and metrics.abnormal is False

    rig.plugin.new_unmounter("pv-fs", POD_UID).tear_down()
    detacher = rig.plugin.new_detacher()
    detacher.unmount_device(dmp)
    detacher.detach(f"{HP}^{handle}", NODE_NAME)
    assert _published_node_ids(rig, handle) == ()
    assert mounts_under(rig.root) == []
    assert tree(rig.root) == sorted([
        "plugins/", "plugins/kubernetes.io/", "plugins/kubernetes.io/csi/", f"{CSI_DIR}/",
        "pods/", f"pods/{POD_UID}/", f"pods/{POD_UID}/volumes/",
        f"pods/{POD_UID}/volumes/kubernetes.io~csi/",
    ])
    rig.client.delete_volume(handle)


def test_block_lifecycle_with_direct_attachment(hostpath_rig: HostPathRigFactory) -> None:
    """A loop-backed block volume: attach, stage, publish onto publish/<spec>/<podUID>, map
    into the pod; bytes written through the pod's device land in the volume's image; teardown
    leaves only the kubelet's empty directories and no loop device."""
    rig = hostpath_rig(enable_attach=True)
    handle, context = _create(rig, "pv-blk", block=True)
    spec = _spec("pv-blk", handle, context, block=True)
    rig.plugin.new_attacher().attach(spec, NODE_NAME)
    mapper = rig.plugin.new_block_volume_mapper(spec, make_pod(), VolumeOptions())
    staging = mapper.set_up_device()
    publish = mapper.map_pod_device()
    assert staging == str(rig.root / BLOCK / "staging/pv-blk")
    assert publish == str(rig.root / BLOCK / f"publish/pv-blk/{POD_UID}")
    assert stat.S_ISBLK(os.stat(publish).st_mode)
    global_map = mapper.get_global_map_path(spec)
    pod_dir, name = mapper.get_pod_device_map_path()
    mounter = rig.host.get_mounter()
    map_block_volume(mounter, device_path=publish, global_map_path=global_map,
                     pod_device_dir=pod_dir, volume_map_name=name, pod_uid=POD_UID)
    with open(os.path.join(pod_dir, name), "r+b") as dev:
        dev.write(b"kubevol-e2e")
        dev.flush()
        os.fsync(dev.fileno())
    images = list(Path(rig.base, "state").rglob(f"{handle}.img"))
    assert len(images) == 1 and images[0].read_bytes()[:11] == b"kubevol-e2e"
    data = json.loads((rig.root / BLOCK / "pv-blk/data/vol_data.json").read_text())
    assert (data["volumeHandle"], data["driverName"], data["specVolID"]) == (handle, HP, "pv-blk")

    unmap_block_volume(mounter, global_map_path=global_map, pod_device_dir=pod_dir,
                       volume_map_name=name, pod_uid=POD_UID)
    unmapper = rig.plugin.new_block_volume_unmapper("pv-blk", POD_UID)
    unmapper.unmap_pod_device()
    unmapper.tear_down_device(global_map, publish)
    rig.plugin.new_detacher().detach(f"{HP}^{handle}", NODE_NAME)
    assert mounts_under(rig.root) == []
    assert tree(rig.root) == sorted([
        "plugins/", "plugins/kubernetes.io/", "plugins/kubernetes.io/csi/", f"{BLOCK}/",
        f"{BLOCK}/publish/", f"{BLOCK}/staging/", "pods/", f"pods/{POD_UID}/",
        f"pods/{POD_UID}/volumeDevices/", f"pods/{POD_UID}/volumeDevices/kubernetes.io~csi/",
    ])
    rig.client.delete_volume(handle)


def test_watcher_registers_hostpath_through_its_registration_socket(
    hostpath_rig: HostPathRigFactory,
) -> None:
    """The framework-served hostpath driver exposes a registration socket; the plugin watcher
    registers it (node id from NodeGetInfo) and deregisters it when the socket goes."""
    rig = hostpath_rig()
    registry = rig.plugin.registry
    registry.deregister_driver(HP)
    registry_dir = Path(rig.host.get_plugins_registry_dir())
    # Registration sockets must be short (107 bytes): expose the dir through /tmp.
    short = Path(f"/tmp/kv-reg-{os.getpid()}")
    short.symlink_to(registry_dir.parent)
    try:
        watched = str(short / "plugins_registry")
        with PluginWatcher.for_registry(watched, registry, resync_interval=60):
            server = serve_registration(rig.running.handle, HP, watched)
            try:
                status = server.wait_for_status(10)
                assert status is not None and status.registered
                assert registry.get(HP).node_info.node_id == HOSTPATH_NODE_ID
            finally:
                server.stop()
            deadline = time.monotonic() + 10
            while registry.is_registered(HP) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not registry.is_registered(HP)
    finally:
        short.unlink()


@pytest.mark.parametrize("policy", ["safe", "kubelet"])
def test_shared_superblock_end_to_end(hostpath_rig: HostPathRigFactory, policy: str) -> None:
    """hostpath --shared-filesystem: two volumes staged from one filesystem; pv-a's pod is
    removed; unmount_device(pv-a) succeeds under ``safe`` (pv-b's pod keeps working) and is
    refused under ``kubelet`` with the kubelet's message naming pv-b's global mount."""
    rig = hostpath_rig(guard_policy=policy, shared=True)
    staged: dict[str, tuple[str, str, str]] = {}
    for name, uid in (("pv-a", "pod-a-uid"), ("pv-b", "pod-b-uid")):
        handle, context = _create(rig, name)
        spec = _spec(name, handle, context)
        attacher = rig.plugin.new_attacher()
        dmp = attacher.get_device_mount_path(spec)
        attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
        mounter = rig.plugin.new_mounter(spec, make_pod(uid=uid), VolumeOptions())
        mounter.set_up(MounterArgs())
        staged[name] = (handle, dmp, mounter.get_path())
    (_, dmp_a, _), (_, dmp_b, pod_b) = staged["pv-a"], staged["pv-b"]
    entries = {e.mount_point: e for e in parse_mountinfo()}
    # Lustre's shape: one device, root "/" for both global mounts.
    assert entries[dmp_a].device == entries[dmp_b].device
    assert entries[dmp_a].root == entries[dmp_b].root == "/"

    rig.plugin.new_unmounter("pv-a", "pod-a-uid").tear_down()
    detacher = rig.plugin.new_detacher()
    if policy == "safe":
        assert rig.plugin.device_unmount_verdict(dmp_a).blocking_refs == ()
        detacher.unmount_device(dmp_a)
        assert dmp_a not in mounts_under(rig.root) and not os.path.exists(dmp_a)
        Path(pod_b, "after").write_text("pv-b still works")
        assert Path(dmp_b, staged["pv-b"][0], "after").read_text() == "pv-b still works"
    else:
        verdict = rig.plugin.device_unmount_verdict(dmp_a)
        assert [r.mount_point for r in verdict.blocking_refs] == [dmp_b]
        with pytest.raises(DeviceStillMountedError) as err:
            detacher.unmount_device(dmp_a)
        assert str(err.value) == (
            f'the device mount path "{dmp_a}" is still mounted by other references [{dmp_b}]'
        )
        assert dmp_a in mounts_under(rig.root)
        rig.plugin.guard_policy = GuardPolicy.SAFE  # finish the teardown the safe way
        detacher.unmount_device(dmp_a)
    rig.plugin.new_unmounter("pv-b", "pod-b-uid").tear_down()
    detacher.unmount_device(dmp_b)
    assert mounts_under(rig.root) == []
    for handle, _, _ in staged.values():
        rig.client.delete_volume(handle)
