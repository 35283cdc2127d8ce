"""What a pod's CSI volume is when its ``vol_data.json`` cannot be trusted: the mount table
and the device (staging) mount it shows.

A pod's ``vol_data.json`` is the record of what to undo: driver and volume handle for
NodeUnpublishVolume, and through them the device mount to unstage. When it is truncated,
empty, of the wrong types or names another volume, tearing the volume down from it either
fails for ever or unpublishes nothing and unmounts the pod's target behind the driver's back
(the staging mount then stays, and the driver keeps the volume published). The kubelet
keeps enough elsewhere on disk to know better: the pod's target is a mount showing the same
filesystem (device and root) as the volume's device mount
``plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/globalmount``, whose own
``vol_data.json`` names driver and handle, and whose directory names are checked against
them.
"""

from __future__ import annotations

import logging
import os
import posixpath

from kubevol import layout
from kubevol.mount.table import MountTable
from kubevol.plugins.csi.driverinfo import LIFECYCLE_PERSISTENT
from kubevol.plugins.csi.voldata import (
    KEY_DRIVER_NAME,
    KEY_LIFECYCLE_MODE,
    KEY_SPEC_VOL_ID,
    KEY_VOLUME_HANDLE,
    VolumeDataError,
    load_volume_data,
    require,
)

log = logging.getLogger(__name__)


def volume_data_from_mounts(
    csi_plugin_dir: str, pod_volume_dir: str, table: MountTable
) -> dict[str, str] | None:
    """The volume data of the CSI volume mounted at ``<pod_volume_dir>/mount``, from the
    device mount it shows in ``table``; None when the target is not mounted or shows no
    device mount of this root whose own vol_data.json agrees with its directory names."""
    target = table.find_mount_point(os.path.realpath(layout.csi_pod_mount_path(pod_volume_dir)))
    if target is None:
        return None
    base = os.path.realpath(csi_plugin_dir)
    best = None
    for entry in table.with_device(target.major, target.minor):
        rel = layout.relative_to(entry.mount_point, base)
        segments = rel.split("/") if rel else []
        if (
            entry.id == target.id
            or len(segments) != 3
            or segments[2] != layout.CSI_GLOBAL_MOUNT_DIR
            or not layout.is_within(target.root, entry.root)
        ):
            continue
        if best is None or len(entry.root) > len(best[0].root):
            best = (entry, segments)
    if best is None:
        return None
    entry, (driver_dir, handle_hash, _) = best
    device_dir = posixpath.dirname(entry.mount_point)
    try:
        data = load_volume_data(device_dir)
        driver, handle = require(data, device_dir, KEY_DRIVER_NAME, KEY_VOLUME_HANDLE)
    except VolumeDataError as exc:
        log.warning("cannot tell the volume mounted at %s: %s", pod_volume_dir, exc)
        return None
    if driver != driver_dir or layout.sha256_hex(handle) != handle_hash:
        log.warning("%s/vol_data.json does not match its directory; not trusted", device_dir)
        return None
    # A volume found through its device mount is persistent: inline ephemeral volumes are
    # never staged.
    return {
        KEY_SPEC_VOL_ID: posixpath.basename(pod_volume_dir.rstrip("/")),
        KEY_DRIVER_NAME: driver,
        KEY_VOLUME_HANDLE: handle,
        KEY_LIFECYCLE_MODE: LIFECYCLE_PERSISTENT,
    }
