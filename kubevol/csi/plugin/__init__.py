"""The ``kubernetes.io/csi`` volume plugin: the kubelet's CSI adapter on kubevol's bases."""

from kubevol.csi.plugin.attacher import CSIAttacher
from kubevol.csi.plugin.block import CSIBlockMapper
from kubevol.csi.plugin.metrics import CSIMetrics
from kubevol.csi.plugin.mounter import CSIMounter
from kubevol.csi.plugin.paths import (
    CSI_PLUGIN_NAME,
    device_mount_path,
    ephemeral_volume_handle,
    pod_mount_path,
    split_volume_name,
    volume_name,
)
from kubevol.csi.plugin.plugin import CSIPlugin
from kubevol.csi.plugin.rules import attach_limit_key, remove_mount_dir
from kubevol.csi.plugin.source import (
    CSIVolumeSource,
    csi_access_mode,
    csi_source,
    volume_capability,
)
from kubevol.csi.plugin.voldata import (
    VolumeDataError,
    VolumeDataMissingError,
    load_volume_data,
    save_volume_data,
)
from kubevol.layout import CSI_VOL_DATA_FILE as VOL_DATA_FILE
from kubevol.mount.blockmap import map_block_device as map_block_volume
from kubevol.mount.blockmap import unmap_block_device as unmap_block_volume

__all__ = [
    "CSI_PLUGIN_NAME",
    "VOL_DATA_FILE",
    "CSIAttacher",
    "CSIBlockMapper",
    "CSIMetrics",
    "CSIMounter",
    "CSIPlugin",
    "CSIVolumeSource",
    "VolumeDataError",
    "VolumeDataMissingError",
    "attach_limit_key",
    "csi_access_mode",
    "csi_source",
    "device_mount_path",
    "ephemeral_volume_handle",
    "load_volume_data",
    "map_block_volume",
    "pod_mount_path",
    "remove_mount_dir",
    "save_volume_data",
    "split_volume_name",
    "unmap_block_volume",
    "volume_capability",
    "volume_name",
]
