"""Covers kubevol.plugins.csi.attach.volumeattachment.

VolumeAttachment-based attachment through the kubernetes client against the stand-in
API server: object names and shapes, waiting with backoff, errors surfaced, detach."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest
from kubernetes import client as k8s

from kubevol.plugins.csi.attach import (
    AttachRequest,
    VolumeAttachmentBackend,
    VolumeAttachmentError,
    attachment_name,
)
from kubevol.testing.kube_api import KubeAPIServer

REQ = AttachRequest(driver="d.example.com", volume_handle="vol-1", node_name="node-1",
                    pv_name="pv-1")
NAME = attachment_name("vol-1", "d.example.com", "node-1")


def _backend(api: KubeAPIServer) -> VolumeAttachmentBackend:
    return VolumeAttachmentBackend(api.api_client(), initial_backoff=0.02, max_backoff=0.05)


def _later(delay: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(delay, action)
    timer.start()
    return timer


def test_attachment_name_is_the_kubelets() -> None:
    """csi-<sha256hex(handle + driver + node)>."""
    assert "csi-" + __import__("hashlib").sha256(b"vol-1d.example.comnode-1").hexdigest() == NAME


@pytest.mark.slow
def test_attach_creates_the_volume_attachment_and_waits_for_attached(api: KubeAPIServer) -> None:
    """Attach creates csi-<sha> (attacher, nodeName, source.persistentVolumeName) and returns
    once the external attacher marks it attached; the publish context is its metadata."""
    backend = _backend(api)
    timer = _later(0.2, lambda: api.set_attached(NAME, metadata={"devicePath": "/dev/sdz"}))
    backend.attach(REQ, timeout=10)
    timer.join()
    va = api.get("volumeattachments", NAME)
    assert va is not None
    assert va["spec"] == {"attacher": "d.example.com", "nodeName": "node-1",
                          "source": {"persistentVolumeName": "pv-1"}}
    assert backend.publish_context(REQ) == {"devicePath": "/dev/sdz"}
    assert backend.wait_for_attach(REQ) == NAME
    assert backend.is_attached(REQ)
    backend.attach(REQ, timeout=1)  # idempotent: an existing attachment is reused
    assert api.names("volumeattachments") == [NAME]


def test_attach_error_is_surfaced(api: KubeAPIServer) -> None:
    """An attachError reported by the attacher ends the wait with its message."""
    backend = _backend(api)
    timer = _later(0.1, lambda: api.set_attach_error(NAME, "rpc error: disk is on fire"))
    with pytest.raises(VolumeAttachmentError, match="disk is on fire"):
        backend.attach(REQ, timeout=10)
    timer.join()


def test_attach_times_out_with_the_kubelets_message(api: KubeAPIServer) -> None:
    """Nobody attaches: the wait ends with the kubelet's timeout message."""
    with pytest.raises(VolumeAttachmentError, match=re.escape(
        "timed out waiting for external-attacher of d.example.com CSI driver to attach "
        "volume vol-1"
    )):
        _backend(api).attach(REQ, timeout=0.3)


def test_wait_for_attach_is_a_single_check(api: KubeAPIServer) -> None:
    """WaitForAttach is one GET: it fails at once when the attachment is missing or not
    attached yet, and succeeds once it is attached."""
    backend = _backend(api)
    with pytest.raises(VolumeAttachmentError, match="not found"):
        backend.wait_for_attach(REQ)
    with pytest.raises(VolumeAttachmentError):
        backend.attach(REQ, timeout=0.1)  # created, never attached
    before = len(api.requests)
    with pytest.raises(VolumeAttachmentError, match="is not attached"):
        backend.wait_for_attach(REQ)
    assert api.requests[before:] == [
        ("GET", f"/apis/storage.k8s.io/v1/volumeattachments/{NAME}")
    ]
    api.set_attached(NAME)
    assert backend.wait_for_attach(REQ) == NAME


@pytest.mark.slow
def test_detach_deletes_and_waits_until_gone(api: KubeAPIServer) -> None:
    """Detach deletes the VolumeAttachment and waits until it is gone (the attacher's
    finalizer released); a detachError is surfaced; detaching again is a no-op."""
    api.auto_attach = True
    api.hold_detach = True
    backend = _backend(api)
    backend.attach(REQ, timeout=5)
    timer = _later(0.2, lambda: api.finish_detach(NAME))
    backend.detach("d.example.com", "vol-1", "node-1", timeout=10)
    timer.join()
    assert api.get("volumeattachments", NAME) is None
    backend.detach("d.example.com", "vol-1", "node-1", timeout=1)
    backend.attach(REQ, timeout=5)
    timer = _later(0.1, lambda: api.set_detach_error(NAME, "still in use by the host"))
    with pytest.raises(VolumeAttachmentError, match="still in use by the host"):
        backend.detach("d.example.com", "vol-1", "node-1", timeout=10)
    timer.join()


def test_deleted_while_waiting_fails_fast(api: KubeAPIServer) -> None:
    """An attachment deleted (or being deleted) during the wait ends it with an error."""
    api.hold_detach = True
    backend = _backend(api)
    storage = k8s.StorageV1Api(api.api_client())
    timer = _later(0.15, lambda: storage.delete_volume_attachment(NAME))
    with pytest.raises(VolumeAttachmentError, match="being deleted"):
        backend.attach(REQ, timeout=10)
    timer.join()
