"""Covers kubevol.plugins.csi.attacher and kubevol.plugins.csi.attach.

The CSI plugin's attachment paths: through VolumeAttachments when the host has a Kubernetes
client (CSIDriver objects and secrets read from the API too), and direct ControllerPublish
for real against a driver."""

from __future__ import annotations

import datetime

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.errors import OperationError, TransientOperationError
from kubevol.plugins.csi.attach import (
    AttachRequest,
    DirectAttachBackend,
    VolumeAttachmentBackend,
    attachment_name,
)
from kubevol.plugins.csi.driverinfo import KubernetesCSIDrivers
from kubevol.testing.csi_driver import Fault
from kubevol.testing.kube_api import KubeAPIServer
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME, NODE_ID
from tests.plugins.csi.plugin.rig import NODE_NAME, POD_UID, Rig, RigFactory, make_pod, pv_spec

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

VA = attachment_name("vol-9", DRIVER_NAME, NODE_NAME)


def _api_rig(make_rig: RigFactory, api: KubeAPIServer) -> Rig:
    client = api.api_client()
    return make_rig(host_kwargs={"kube_client": client,
                                 "csi_drivers": KubernetesCSIDrivers(client)})


def test_kubernetes_host_attaches_with_volume_attachments(
    make_rig: RigFactory, api: KubeAPIServer
) -> None:
    """With an API client the plugin uses VolumeAttachments: attach creates csi-<sha> and
    waits for the attacher; the attachment metadata is the publish context of NodeStage and
    NodePublish; detach deletes it; secrets come from the API."""
    api.auto_attach = True
    api.attach_metadata = {"lun": "7"}
    api.add_secret("shop", "publish-creds", {"password": "s3cret"})
    rig = _api_rig(make_rig, api)
    assert isinstance(rig.plugin.attach_backend, VolumeAttachmentBackend)
    spec = pv_spec("pv-9", "vol-9", extra_csi={
        "nodePublishSecretRef": {"name": "publish-creds", "namespace": "shop"}})
    attacher = rig.plugin.new_attacher()
    assert rig.plugin.can_attach(spec)  # no CSIDriver object: attach required
    attacher.attach(spec, NODE_NAME)
    assert api.names("volumeattachments") == [VA]
    assert attacher.wait_for_attach(spec, "", make_pod(), datetime.timedelta(seconds=1)) == VA
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    rig.plugin.new_mounter(spec, make_pod(), VolumeOptions()).set_up(MounterArgs())
    assert rig.driver.requests("NodeStageVolume")[0]["publish_context"] == {"lun": "7"}
    publish = rig.driver.requests("NodePublishVolume")[0]
    assert publish["publish_context"] == {"lun": "7"}
    assert publish["secrets"] == {"password": "s3cret"}
    rig.plugin.new_unmounter("pv-9", POD_UID).tear_down()
    detacher = rig.plugin.new_detacher()
    detacher.unmount_device(dmp)
    detacher.detach(f"{DRIVER_NAME}^vol-9", NODE_NAME)
    assert api.names("volumeattachments") == []


def test_missing_volume_attachment_makes_stage_transient(
    make_rig: RigFactory, api: KubeAPIServer
) -> None:
    """No VolumeAttachment yet: staging fails transiently (the kubelet retries) and nothing is
    created on disk."""
    rig = _api_rig(make_rig, api)
    spec = pv_spec("pv-9", "vol-9")
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    with pytest.raises(TransientOperationError, match="not found"):
        attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    assert not rig.root.joinpath("plugins").exists()
    assert rig.driver.names() == []


def test_attach_not_required_skips_volume_attachments(
    make_rig: RigFactory, api: KubeAPIServer
) -> None:
    """A CSIDriver with attachRequired: false (read from the API) needs no VolumeAttachment:
    can_attach is false, attach does nothing, pod info is added from the same object."""
    api.add_csidriver({"metadata": {"name": DRIVER_NAME},
                       "spec": {"attachRequired": False, "podInfoOnMount": True}})
    rig = _api_rig(make_rig, api)
    spec = pv_spec("pv-9", "vol-9")
    assert not rig.plugin.can_attach(spec)
    attacher = rig.plugin.new_attacher()
    attacher.attach(spec, NODE_NAME)
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    rig.plugin.new_mounter(spec, make_pod(), VolumeOptions()).set_up(MounterArgs())
    assert api.names("volumeattachments") == []
    context = rig.driver.requests("NodePublishVolume")[0]["volume_context"]
    assert context["csi.storage.k8s.io/pod.uid"] == POD_UID
    assert context["csi.storage.k8s.io/ephemeral"] == "false"
    assert rig.plugin.new_attacher().volumes_are_attached([spec], NODE_NAME) == {spec: True}
    rig.plugin.new_unmounter("pv-9", POD_UID).tear_down()
    attacher.unmount_device(dmp)


def test_direct_backend_for_real(make_rig: RigFactory) -> None:
    """Direct attachment against the driver: the CSI node id from registration, the publish
    context kept and obtained again after a restart of the backend, NOT_FOUND on unpublish
    meaning detached, and failures of unpublish surfaced."""
    rig = make_rig(controller_caps={t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME})
    backend = rig.plugin.attach_backend
    assert isinstance(backend, DirectAttachBackend)
    request = AttachRequest(driver=DRIVER_NAME, volume_handle="vol-9", node_name=NODE_NAME)
    assert not backend.is_attached(request)
    backend.attach(request, timeout=5)
    assert backend.is_attached(request)
    assert rig.driver.published == {"vol-9": NODE_ID}
    fresh = DirectAttachBackend(rig.registry)  # a restarted agent knows nothing yet
    assert fresh.publish_context(request)["attachedTo"] == NODE_ID
    assert fresh.wait_for_attach(request) == request.attachment_id
    rig.driver.fail["ControllerUnpublishVolume"] = (grpc.StatusCode.INTERNAL, "stuck")
    with pytest.raises(OperationError, match="stuck"):
        backend.detach(DRIVER_NAME, "vol-9", NODE_NAME, timeout=5)
    rig.driver.fail["ControllerUnpublishVolume"] = (grpc.StatusCode.NOT_FOUND, "gone")
    backend.detach(DRIVER_NAME, "vol-9", NODE_NAME, timeout=5)
    assert not backend.is_attached(request)


def _asked_capabilities(rig: Rig) -> int:
    return [r.rpc for r in rig.driver.records].count("ControllerGetCapabilities")


def test_the_direct_backend_learns_at_registration_whether_a_driver_attaches(
    make_rig: RigFactory,
) -> None:
    """A driver that registers is asked ControllerGetCapabilities then, once: whether
    attaching means anything for its volumes is known without a call (``ask=False``, what
    a restarted agent asks of every volume it finds), and later questions call nobody."""
    rig = make_rig(controller_caps={t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME},
                   register=False)
    backend = rig.plugin.attach_backend
    detacher = rig.plugin.new_detacher()
    assert backend.attaches_known(DRIVER_NAME) is None  # not registered
    assert detacher.detaches(f"{DRIVER_NAME}^vol-9", ask=False) is True  # the stricter answer
    rig.registry.register_driver(DRIVER_NAME, rig.handle.address, ["1.0.0"])
    assert _asked_capabilities(rig) == 1
    assert backend.attaches_known(DRIVER_NAME) is True
    assert detacher.detaches(f"{DRIVER_NAME}^vol-9", ask=False) is True
    assert backend.attaches(DRIVER_NAME) is True
    assert _asked_capabilities(rig) == 1


def test_a_driver_not_answering_its_capabilities_at_registration_registers_all_the_same(
    make_rig: RigFactory,
) -> None:
    """ControllerGetCapabilities failing at registration leaves the driver registered and
    the answer unknown: ``ask=False`` gives the stricter answer without calling, asking
    calls the driver again."""
    rig = make_rig(register=False)
    rig.driver.fail["ControllerGetCapabilities"] = Fault(
        code=grpc.StatusCode.UNAVAILABLE, message="busy", times=1)
    rig.registry.register_driver(DRIVER_NAME, rig.handle.address, ["1.0.0"])
    backend = rig.plugin.attach_backend
    assert backend.attaches_known(DRIVER_NAME) is None
    detacher = rig.plugin.new_detacher()
    assert detacher.detaches(f"{DRIVER_NAME}^vol-9", ask=False) is True
    assert _asked_capabilities(rig) == 1
    assert detacher.detaches(f"{DRIVER_NAME}^vol-9") is False  # asked now: no attaching
    assert _asked_capabilities(rig) == 2
    assert backend.attaches_known(DRIVER_NAME) is False
