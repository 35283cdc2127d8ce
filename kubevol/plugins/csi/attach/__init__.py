"""Attaching CSI volumes to nodes: through VolumeAttachment objects or directly."""

from kubevol.plugins.csi.attach.base import AttachBackend, AttachRequest, attachment_name
from kubevol.plugins.csi.attach.direct import DirectAttachBackend
from kubevol.plugins.csi.attach.volumeattachment import (
    APIError,
    VolumeAttachmentBackend,
    VolumeAttachmentError,
)

__all__ = [
    "APIError",
    "AttachBackend",
    "AttachRequest",
    "DirectAttachBackend",
    "VolumeAttachmentBackend",
    "VolumeAttachmentError",
    "attachment_name",
]
