"""Covers kubevol.plugins.csi.plugin in kubevol.manager, and SELinux mounts.

The CSI plugin inside a VolumePluginMgr, and SELinux context mounts.
"""

from __future__ import annotations

import json
import os

import pytest

from kubevol.manager import VolumePluginMgr
from kubevol.node.host import node_plugins
from kubevol.plugins.csi import CSI_PLUGIN_NAME, CSIPlugin
from kubevol.plugins.csi.driverinfo import LocalCSIDrivers
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME
from tests.plugins.csi.plugin.rig import POD_UID, Rig, RigFactory, inline_spec, make_pod, pv_spec

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


def test_plugin_manager_finds_the_csi_plugin_for_every_role(rig: Rig) -> None:
    """Registered next to the built-in plugins, the CSI plugin is found by name and by spec,
    as attachable, device-mountable, block, expandable, node-expandable and limited."""
    mgr = VolumePluginMgr()
    plugin = CSIPlugin(registry=rig.registry)
    mgr.init_plugins(node_plugins(csi=plugin), host=rig.host)
    spec = pv_spec("pv-a", "h-1")
    assert mgr.find_plugin_by_name(CSI_PLUGIN_NAME) is plugin
    assert mgr.find_plugin_by_spec(spec) is plugin
    assert mgr.find_plugin_by_spec(inline_spec("scratch")) is plugin
    assert mgr.find_attachable_plugin_by_spec(spec) is plugin
    assert mgr.find_device_mountable_plugin_by_spec(spec) is plugin
    assert mgr.find_mapper_plugin_by_spec(pv_spec("pv-b", "b", block=True)) is plugin
    assert mgr.find_node_expandable_plugin_by_spec(spec) is plugin
    assert mgr.find_expandable_plugin_by_spec(spec) is plugin
    assert mgr.find_persistent_plugin_by_spec(spec) is plugin
    assert mgr.find_volume_plugin_with_limits_by_spec(spec) is plugin
    assert mgr.find_device_mountable_plugin_by_spec(inline_spec("scratch")) is None


def test_selinux_context_mount_when_the_csidriver_allows_it(make_rig: RigFactory) -> None:
    """With seLinuxMount in the CSIDriver and a label asked for, stage and publish get a
    context= mount option and vol_data.json records it; reconstruction gives it back."""
    label = "system_u:object_r:container_file_t:s0:c1,c2"
    rig = make_rig(csi_drivers=LocalCSIDrivers(
        [{"metadata": {"name": DRIVER_NAME}, "spec": {"seLinuxMount": True}}]))
    spec = pv_spec("pv-a", "h-1", access_modes=("ReadWriteOncePod",))
    assert rig.plugin.supports_selinux_context_mount(spec)
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs(selinux_label=label))
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs(selinux_label=label))
    option = f'context="{label}"'
    for rpc in ("NodeStageVolume", "NodePublishVolume"):
        assert rig.driver.requests(rpc)[0]["volume_capability"]["mount"]["mount_flags"] == [option]
    vol_dir = os.path.dirname(mounter.get_path())
    with open(os.path.join(vol_dir, "vol_data.json")) as f:
        assert json.load(f)["seLinuxMountContext"] == label
    with open(os.path.join(os.path.dirname(dmp), "vol_data.json")) as f:
        assert json.load(f)["seLinuxMountContext"] == label
    assert rig.plugin.construct_volume_spec("pv-a", vol_dir).selinux_mount_context == label
    rig.plugin.new_unmounter("pv-a", POD_UID).tear_down()
    attacher.unmount_device(dmp)
