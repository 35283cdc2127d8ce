"""Names and paths of the ``kubernetes.io/csi`` plugin, exactly as the kubelet lays them out::

    plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/globalmount      device (staging) mount
    plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/vol_data.json
    pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount                        pod (publish) mount
    pods/<uid>/volumes/kubernetes.io~csi/<spec>/vol_data.json
    plugins/kubernetes.io/csi/volumeDevices/<spec>/dev                       block global map path
    plugins/kubernetes.io/csi/volumeDevices/<spec>/data/vol_data.json
    plugins/kubernetes.io/csi/volumeDevices/staging/<spec>                   block staging path
    plugins/kubernetes.io/csi/volumeDevices/publish/<spec>/<podUID>          block publish path
    pods/<uid>/volumeDevices/kubernetes.io~csi/<spec>                        pod block device

Driver names, spec names and pod UIDs are validated as path segments (the host checks
them too), so nothing is ever placed outside the root.
"""

from __future__ import annotations

import os

from kubevol.host import VolumeHost, escape_plugin_name, validate_path_segment
from kubevol.mount.layout import sha256_hex

CSI_PLUGIN_NAME = "kubernetes.io/csi"
#: Separates driver and handle in a volume name (``driver^handle``).
VOLUME_NAME_SEPARATOR = "^"
GLOBAL_MOUNT_DIR = "globalmount"
POD_MOUNT_DIR = "mount"


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
    if not handle:
        raise ValueError("the CSI volume handle is empty")
    return os.path.join(
        host.get_plugin_dir(CSI_PLUGIN_NAME),
        validate_path_segment(driver, "CSI driver name"),
        sha256_hex(handle),
        GLOBAL_MOUNT_DIR,
    )


def pod_volume_dir(host: VolumeHost, pod_uid: str, spec_name: str) -> str:
    """``pods/<uid>/volumes/kubernetes.io~csi/<spec>`` (holds ``mount`` and vol_data.json)."""
    return host.get_pod_volume_dir(pod_uid, CSI_PLUGIN_NAME, escape_plugin_name(spec_name))


def pod_mount_path(host: VolumeHost, pod_uid: str, spec_name: str) -> str:
    """``pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount``."""
    return os.path.join(pod_volume_dir(host, pod_uid, spec_name), POD_MOUNT_DIR)


def _block_dir(host: VolumeHost) -> str:
    return host.get_volume_device_plugin_dir(CSI_PLUGIN_NAME)


def _spec_segment(spec_name: str) -> str:
    return validate_path_segment(escape_plugin_name(spec_name), "volume spec name")


def block_volume_dir(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/<spec>``."""
    return os.path.join(_block_dir(host), _spec_segment(spec_name))


def block_global_map_path(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/<spec>/dev``."""
    return os.path.join(block_volume_dir(host, spec_name), "dev")


def block_data_dir(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/<spec>/data`` (holds vol_data.json)."""
    return os.path.join(block_volume_dir(host, spec_name), "data")


def block_staging_path(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/staging/<spec>``."""
    return os.path.join(_block_dir(host), "staging", _spec_segment(spec_name))


def block_publish_dir(host: VolumeHost, spec_name: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/publish/<spec>``."""
    return os.path.join(_block_dir(host), "publish", _spec_segment(spec_name))


def block_publish_path(host: VolumeHost, spec_name: str, pod_uid: str) -> str:
    """``plugins/kubernetes.io/csi/volumeDevices/publish/<spec>/<podUID>``."""
    return os.path.join(
        block_publish_dir(host, spec_name), validate_path_segment(pod_uid, "pod UID")
    )
