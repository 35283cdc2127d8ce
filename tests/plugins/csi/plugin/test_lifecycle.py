"""Covers kubevol.plugins.csi.mounter and kubevol.plugins.csi.attacher: full lifecycles.

Full lifecycles of CSI volumes through the plugin, on real bind mounts against a real
driver on a unix socket: exactly the kubelet's files on disk, and nothing left after."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.layout import sha256_hex
from kubevol.plugins.csi.attach import attachment_name
from kubevol.testing.mount_rig import mounts_under
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME, NODE_ID, tree
from tests.plugins.csi.plugin.rig import NODE_NAME, POD_UID, Rig, RigFactory, make_pod, pv_spec

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

HANDLE = "vol-0001"
SHA = sha256_hex(HANDLE)
CSI_DIR = f"plugins/kubernetes.io/csi/{DRIVER_NAME}"
POD_VOL = f"pods/{POD_UID}/volumes/kubernetes.io~csi/pv-a"

#: What the kubelet leaves behind after a full teardown: empty ancestors only.
LEFTOVERS = [
    "plugins/",
    "plugins/kubernetes.io/",
    "plugins/kubernetes.io/csi/",
    f"{CSI_DIR}/",
    "pods/",
    f"pods/{POD_UID}/",
    f"pods/{POD_UID}/volumes/",
    f"pods/{POD_UID}/volumes/kubernetes.io~csi/",
]


def _set_up(rig: Rig, *, read_only: bool = False) -> tuple[str, str]:
    """Attach, stage and publish pv-a; returns (device mount path, pod mount path)."""
    spec = pv_spec("pv-a", HANDLE, read_only=read_only)
    attacher = rig.plugin.new_attacher()
    attacher.attach(spec, NODE_NAME)
    attacher.wait_for_attach(spec, "", make_pod(), datetime.timedelta(seconds=5))
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    return dmp, mounter.get_path()


def _tear_down(rig: Rig, dmp: str) -> None:
    unmounter = rig.plugin.new_unmounter("pv-a", POD_UID)
    unmounter.tear_down()
    detacher = rig.plugin.new_detacher()
    detacher.unmount_device(dmp)
    detacher.detach(f"{DRIVER_NAME}^{HANDLE}", NODE_NAME)


def test_staged_filesystem_lifecycle_leaves_the_kubelet_layout(rig: Rig) -> None:
    """Stage + publish lay out exactly the kubelet's paths and vol_data.json bytes; teardown
    removes every mount and file, leaving only the empty directories the kubelet leaves."""
    dmp, pod_path = _set_up(rig)
    root = rig.root
    assert dmp == str(root / CSI_DIR / SHA / "globalmount")
    assert pod_path == str(root / POD_VOL / "mount")
    assert mounts_under(root) == [dmp, pod_path]
    assert tree(root) == sorted([
        *LEFTOVERS,
        f"{CSI_DIR}/{SHA}/", f"{CSI_DIR}/{SHA}/globalmount/", f"{CSI_DIR}/{SHA}/vol_data.json",
        f"{POD_VOL}/", f"{POD_VOL}/mount/", f"{POD_VOL}/vol_data.json",
    ])
    # Byte for byte what the kubelet's json.Encoder writes.
    assert (root / CSI_DIR / SHA / "vol_data.json").read_text() == (
        f'{{"driverName":"{DRIVER_NAME}","volumeHandle":"{HANDLE}"}}\n'
    )
    assert json.loads((root / POD_VOL / "vol_data.json").read_text()) == {
        "specVolID": "pv-a",
        "volumeHandle": HANDLE,
        "driverName": DRIVER_NAME,
        "nodeName": NODE_NAME,
        "volumeLifecycleMode": "Persistent",
        "attachmentID": attachment_name(HANDLE, DRIVER_NAME, NODE_NAME),
    }
    # The data really flows: written through the pod's mount, seen in the volume.
    Path(pod_path, "hello").write_text("world")
    assert (rig.driver.volume_dir(HANDLE) / "hello").read_text() == "world"
    publish = rig.driver.requests("NodePublishVolume")[0]
    assert publish["staging_target_path"] == dmp
    assert publish["volume_capability"]["access_mode"]["mode"] == "SINGLE_NODE_WRITER"
    assert publish["volume_capability"]["mount"]["fs_type"] == "ext4"

    _tear_down(rig, dmp)
    assert mounts_under(root) == []
    assert tree(root) == LEFTOVERS
    assert rig.driver.names() == [
        "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume",
    ]


@pytest.mark.parametrize(("max_age", "asked"), [(10.0, 1), (-1.0, 3)])
def test_one_answer_to_node_get_capabilities_serves_a_lifecycle(
    make_rig: RigFactory, monkeypatch: pytest.MonkeyPatch, max_age: float, asked: int
) -> None:
    """Stage, publish and unstage each need the node capabilities: one answer
    serves them all while it is younger than NODE_CAPABILITIES_MAX_AGE (the kubelet asks
    before each); an older one is asked again."""
    monkeypatch.setattr("kubevol.plugins.csi.context.NODE_CAPABILITIES_MAX_AGE", max_age)
    rig = make_rig()
    dmp, _ = _set_up(rig)
    _tear_down(rig, dmp)
    assert rig.driver.calls.count("NodeGetCapabilities") == asked
    assert mounts_under(rig.root) == []


def test_lifecycle_without_staging_only_publishes(make_rig: RigFactory) -> None:
    """A driver without STAGE_UNSTAGE gets no NodeStage, no staging path in NodePublish; the
    global directory still gets vol_data.json (UnmountDevice needs it) and is removed."""
    rig = make_rig(node_caps={t.NodeCapability.GET_VOLUME_STATS})
    dmp, pod_path = _set_up(rig)
    assert mounts_under(rig.root) == [pod_path]
    assert (rig.root / CSI_DIR / SHA / "vol_data.json").exists()
    assert os.path.isdir(dmp) and not os.path.ismount(dmp)
    assert "staging_target_path" not in rig.driver.requests("NodePublishVolume")[0]
    _tear_down(rig, dmp)
    assert mounts_under(rig.root) == []
    assert tree(rig.root) == LEFTOVERS
    assert rig.driver.names() == ["NodePublishVolume", "NodeUnpublishVolume"]


def test_direct_attachment_publishes_context_into_stage_and_publish(make_rig: RigFactory) -> None:
    """With PUBLISH_UNPUBLISH_VOLUME, attach calls ControllerPublishVolume with the CSI node id
    from registration; its publish context reaches NodeStage and NodePublish; detach calls
    ControllerUnpublishVolume."""
    rig = make_rig(controller_caps={t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME})
    dmp, _ = _set_up(rig, read_only=True)
    published = rig.driver.requests("ControllerPublishVolume")
    assert len(published) == 1
    assert published[0]["node_id"] == NODE_ID
    assert published[0]["readonly"] is True
    context = {"devicePath": f"/dev/fake/{HANDLE}", "attachedTo": NODE_ID}
    assert rig.driver.requests("NodeStageVolume")[0]["publish_context"] == context
    assert rig.driver.requests("NodePublishVolume")[0]["publish_context"] == context
    assert rig.driver.requests("NodePublishVolume")[0]["readonly"] is True
    _tear_down(rig, dmp)
    assert rig.driver.names() == [
        "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume",
        "NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume",
    ]
    assert rig.driver.published == {}
    assert tree(rig.root) == LEFTOVERS


def test_direct_backend_skips_drivers_without_publish_unpublish(rig: Rig) -> None:
    """A driver that does not advertise PUBLISH_UNPUBLISH_VOLUME is never asked to attach,
    and NodeStage gets an empty publish context."""
    dmp, _ = _set_up(rig)
    assert rig.driver.requests("ControllerPublishVolume") == []
    assert "publish_context" not in rig.driver.requests("NodeStageVolume")[0]
    _tear_down(rig, dmp)
    assert rig.driver.requests("ControllerUnpublishVolume") == []
