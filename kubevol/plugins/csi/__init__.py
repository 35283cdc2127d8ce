"""The ``kubernetes.io/csi`` volume plugin: the kubelet's CSI adapter on kubevol's bases
(:class:`CSIPlugin`), with driver registration (:mod:`~kubevol.plugins.csi.registration`:
:class:`DriverRegistry`, :class:`PluginWatcher`), CSIDriver information
(:mod:`~kubevol.plugins.csi.driverinfo`) and attachment backends
(:mod:`~kubevol.plugins.csi.attach`)."""

from kubevol.layout import CSI_VOL_DATA_FILE as VOL_DATA_FILE
from kubevol.mount.blockmap import map_block_device as map_block_volume
from kubevol.mount.blockmap import unmap_block_device as unmap_block_volume
from kubevol.plugins.csi.attach import DirectAttachBackend, VolumeAttachmentBackend
from kubevol.plugins.csi.attacher import CSIAttacher
from kubevol.plugins.csi.block import CSIBlockMapper
from kubevol.plugins.csi.driverinfo import CSIDriverInfo, KubernetesCSIDrivers, LocalCSIDrivers
from kubevol.plugins.csi.metrics import CSIMetrics
from kubevol.plugins.csi.mounter import CSIMounter
from kubevol.plugins.csi.paths import (
    CSI_PLUGIN_NAME,
    device_mount_path,
    ephemeral_volume_handle,
    pod_mount_path,
    split_volume_name,
    volume_name,
)
from kubevol.plugins.csi.plugin import CSIPlugin
from kubevol.plugins.csi.registration import (
    DriverNotRegisteredError,
    DriverRegistry,
    PluginWatcher,
    RegistrationServer,
    serve_registration,
)
from kubevol.plugins.csi.rules import attach_limit_key, remove_mount_dir
from kubevol.plugins.csi.source import (
    CSIVolumeSource,
    csi_access_mode,
    csi_source,
    volume_capability,
)
from kubevol.plugins.csi.voldata import (
    VolumeDataError,
    VolumeDataMissingError,
    load_volume_data,
    save_volume_data,
)

__all__ = [
    "CSI_PLUGIN_NAME",
    "VOL_DATA_FILE",
    "CSIAttacher",
    "CSIBlockMapper",
    "CSIDriverInfo",
    "CSIMetrics",
    "CSIMounter",
    "CSIPlugin",
    "CSIVolumeSource",
    "DirectAttachBackend",
    "DriverNotRegisteredError",
    "DriverRegistry",
    "KubernetesCSIDrivers",
    "LocalCSIDrivers",
    "PluginWatcher",
    "RegistrationServer",
    "VolumeAttachmentBackend",
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
    "serve_registration",
    "split_volume_name",
    "unmap_block_volume",
    "volume_capability",
    "volume_name",
]
