"""The attachment backend interface: how a CSI volume gets attached to a node.

The kubelet never attaches itself: the attach/detach controller creates a VolumeAttachment
and an external attacher calls ``ControllerPublishVolume``; the node only reads the
publish context back. A kubevol agent picks a backend:

- :class:`~kubevol.plugins.csi.attach.VolumeAttachmentBackend` -- the Kubernetes way, through
  VolumeAttachment objects;
- :class:`~kubevol.plugins.csi.attach.DirectAttachBackend` -- no API server: call the driver's
  ControllerPublishVolume/ControllerUnpublishVolume directly, as Nomad does.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping

import attrs

from kubevol.csi import types as t
from kubevol.layout import sha256_hex


def attachment_name(volume_handle: str, driver: str, node_name: str) -> str:
    """``csi-<sha256hex(handle + driver + node)>``: the VolumeAttachment (attachment id) name."""
    return "csi-" + sha256_hex(f"{volume_handle}{driver}{node_name}")


@attrs.frozen(kw_only=True)
class AttachRequest:
    """One volume to attach to (or find attached on) one node.

    ``capability``, ``read_only``, ``volume_context`` and ``secrets`` are what a direct
    ControllerPublishVolume needs; ``pv_name`` is what a VolumeAttachment records.
    """

    driver: str
    volume_handle: str
    node_name: str
    pv_name: str = ""
    capability: t.VolumeCapability = attrs.field(
        factory=lambda: t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_WRITER)
    )
    read_only: bool = False
    volume_context: Mapping[str, str] = attrs.field(factory=dict)
    secrets: Mapping[str, str] = attrs.field(factory=dict, repr=False)

    @property
    def attachment_id(self) -> str:
        """The VolumeAttachment name for this volume and node."""
        return attachment_name(self.volume_handle, self.driver, self.node_name)


class AttachBackend(abc.ABC):
    """Attaches CSI volumes to nodes and reports their publish context. Thread-safe.

    Failures raise :class:`~kubevol.errors.OperationError` (an attach error reported by
    the storage, a timeout) or :class:`~kubevol.errors.KubevolError` subclasses of the
    transport; the CSI plugin decides which of them are transient, as the kubelet does.
    """

    @abc.abstractmethod
    def attaches(self, driver: str) -> bool:
        """Whether attaching means anything for ``driver`` (False: attach and detach are
        no-ops and the publish context is empty)."""

    def attaches_known(self, driver: str) -> bool | None:
        """:meth:`attaches`, when it is known without calling anyone; else None."""
        return None

    @abc.abstractmethod
    def attach(self, request: AttachRequest, *, timeout: float) -> None:
        """Attach and block until attached, or raise. Idempotent."""

    @abc.abstractmethod
    def wait_for_attach(self, request: AttachRequest) -> str:
        """One check that the volume is attached (the kubelet's ``WaitForAttach``): returns
        the attachment id, raises when it is not (yet) attached."""

    @abc.abstractmethod
    def is_attached(self, request: AttachRequest) -> bool:
        """Whether the volume is attached to ``request.node_name``; never raises on "no"."""

    @abc.abstractmethod
    def publish_context(self, request: AttachRequest) -> dict[str, str]:
        """The publish context of the attachment, for NodeStage and NodePublish.

        Raises when the volume is not attached.
        """

    @abc.abstractmethod
    def detach(self, driver: str, volume_handle: str, node_name: str, *, timeout: float) -> None:
        """Detach and block until detached. Idempotent: an unattached volume is success."""
