"""Names of the ``kubernetes.io/csi`` plugin, and its paths (:mod:`kubevol.layout`) under the
directories a :class:`~kubevol.host.VolumeHost` gives it.

Driver names, spec names and pod UIDs are validated as path segments, so nothing is ever
placed outside the root.
"""

from __future__ import annotations

from kubevol import layout
from kubevol.host import VolumeHost
from kubevol.layout import CSI_PLUGIN_NAME, sha256_hex

__all__ = [
    "CSI_PLUGIN_NAME",
    "VOLUME_NAME_SEPARATOR",
    "block_data_dir",
    "block_global_map_path",
    "block_publish_dir",
    "block_publish_path",
    "block_staging_path",
    "block_volume_dir",
    "device_mount_path",
    "ephemeral_volume_handle",
    "pod_mount_path",
    "pod_volume_dir",
    "split_volume_name",
    "volume_name",
]

#: Separates driver and handle in a volume name (``driver^handle``).
VOLUME_NAME_SEPARATOR = "^"


def volume_name(driver: str, handle: str) -> str:
    """``driver^handle``, the unique name of a CSI volume."""
    return f"{driver}{VOLUME_NAME_SEPARATOR}{handle}"


def split_volume_name(name: str) -> tuple[str, str]:
    """(driver, handle) from ``driver^handle``; ValueError when it has no single ``^``."""
    parts = name.split(VOLUME_NAME_SEPARATOR)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise ValueError(f"volume name {name!r} is not of the form driver^handle")
    return parts[0], parts[1]


def ephemeral_volume_handle(pod_uid: str, spec_name: str) -> str:
    """``csi-<sha256hex(podUID + specName)>``: the handle of an inline ephemeral volume."""
    return "csi-" + sha256_hex(f"{pod_uid}{spec_name}")


def device_mount_path(host: VolumeHost, driver: str, handle: str) -> str:
    """``plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/globalmount``."""
    return layout.csi_device_mount_path(host.get_plugin_dir(CSI_PLUGIN_NAME), driver, handle)


def pod_volume_dir(host: VolumeHost, pod_uid: str, spec_name: str) -> str:
    """``pods/<uid>/volumes/kubernetes.io~csi/<spec>`` (holds ``mount`` and vol_data.json)."""
    return host.get_pod_volume_dir(pod_uid, CSI_PLUGIN_NAME, layout.escape_plugin_name(spec_name))


def pod_mount_path(host: VolumeHost, pod_uid: str, spec_name: str) -> str:
    """``pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount``."""
    return layout.csi_pod_mount_path(pod_volume_dir(host, pod_uid, spec_name))


def _block_dir(host: VolumeHost) -> str:
    return host.get_volume_device_plugin_dir(CSI_PLUGIN_NAME)


def block_volume_dir(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/<spec>``."""
    return layout.csi_block_volume_dir(_block_dir(host), spec_name)


def block_global_map_path(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/<spec>/dev``."""
    return layout.csi_block_global_map_path(_block_dir(host), spec_name)


def block_data_dir(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/<spec>/data`` (holds vol_data.json)."""
    return layout.csi_block_data_dir(_block_dir(host), spec_name)


def block_staging_path(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/staging/<spec>``."""
    return layout.csi_block_staging_path(_block_dir(host), spec_name)


def block_publish_dir(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/publish/<spec>``."""
    return layout.csi_block_publish_dir(_block_dir(host), spec_name)


def block_publish_path(host: VolumeHost, spec_name: str, pod_uid: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/publish/<spec>/<podUID>``."""
    return layout.csi_block_publish_path(_block_dir(host), spec_name, pod_uid)
