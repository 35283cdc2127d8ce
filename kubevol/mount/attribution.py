"""Which volume a path under the kubelet root belongs to: the layout (:mod:`kubevol.layout`)
tells the role and the names, and the ``vol_data.json`` files the CSI plugin keeps beside its
mounts tell a CSI volume's driver and handle.

A volume's identity is (driver, volume handle) for CSI and (plugin, volume name) otherwise.
"""

from __future__ import annotations

import os
import posixpath

import attrs

from kubevol import layout
from kubevol.layout import CSI_PLUGIN_NAME, PathRole, sha256_hex
from kubevol.util.safeio import load_json_file


@attrs.frozen(kw_only=True)
class VolumeIdentity:
    """Who a kubelet-managed mount belongs to; equal identities mean the same volume."""

    plugin: str
    #: ``<driver>^<sha256hex(handle)>`` for CSI (comparable whether the handle or only its
    #: hash is known), the volume name for in-tree plugins.
    name: str
    #: Human description (driver and handle when known); not part of the identity.
    description: str = attrs.field(eq=False)


@attrs.frozen(kw_only=True)
class KubeletPath:
    """What the layout and the files beside a path say about it."""

    role: PathRole
    #: None when the layout is recognised but the volume cannot be told (vol_data.json
    #: missing or unreadable); ``problem`` then says why.
    volume: VolumeIdentity | None
    pod_uid: str | None = None
    problem: str = ""


def csi_identity(driver: str, handle_hash: str, handle: str | None = None) -> VolumeIdentity:
    """Identity of a CSI volume from its driver and ``sha256hex(handle)``."""
    shown = f"handle {handle!r}" if handle is not None else f"handle hash {handle_hash}"
    return VolumeIdentity(
        plugin=CSI_PLUGIN_NAME, name=f"{driver}^{handle_hash}", description=f"CSI {driver} {shown}"
    )


def attribute(root_dir: str, rel: str) -> KubeletPath | None:
    """Attribute ``rel`` (a path relative to ``root_dir``) to a volume; None when it is not in
    a layout the kubelet uses. Reads the ``vol_data.json`` files the layout puts beside mounts
    (and, for a subPath mount, which plugin's directory holds its volume).
    """
    described = layout.describe(rel)
    if described is None:
        return None
    if described.role is PathRole.POD_SUBPATH:
        return _attribute_subpath(root_dir, described)
    assert described.plugin_name is not None
    return _attribute(root_dir, described, described.plugin_name)


def _attribute(root: str, described: layout.LayoutPath, plugin: str) -> KubeletPath:
    if plugin != CSI_PLUGIN_NAME:
        name = described.volume_name
        identity = VolumeIdentity(plugin=plugin, name=name, description=f"{plugin} {name}")
        return KubeletPath(role=described.role, volume=identity, pod_uid=described.pod_uid)
    volume: VolumeIdentity | None = None
    problem = ""
    if described.vol_data_dir is not None:
        vol_data = layout.csi_vol_data_path(posixpath.join(root, described.vol_data_dir))
        volume, problem = _csi_from_vol_data(vol_data)
    if volume is None and described.csi_driver is not None:
        # The directory name itself is sha256hex(handle): enough to tell volumes apart.
        volume, problem = csi_identity(described.csi_driver, described.volume_name), ""
    return KubeletPath(
        role=described.role, volume=volume, pod_uid=described.pod_uid, problem=problem
    )


def _attribute_subpath(root: str, described: layout.LayoutPath) -> KubeletPath:
    uid, vol = described.pod_uid, described.volume_name
    assert uid is not None
    volumes_dir = posixpath.join(root, layout.PODS_DIR, uid, layout.POD_VOLUMES_DIR)
    try:
        plugin_dirs = sorted(os.listdir(volumes_dir))
    except OSError as exc:
        return KubeletPath(
            role=PathRole.POD_SUBPATH,
            volume=None,
            pod_uid=uid,
            problem=f"cannot list {volumes_dir}: {exc.strerror}",
        )
    for plugin_dir in plugin_dirs:
        if os.path.isdir(posixpath.join(volumes_dir, plugin_dir, vol)):
            plugin = layout.unescape_plugin_name(plugin_dir)
            volume = layout.describe_pod_volume(uid, layout.POD_VOLUMES_DIR, plugin, vol)
            return _attribute(root, attrs.evolve(volume, role=PathRole.POD_SUBPATH), plugin)
    return KubeletPath(
        role=PathRole.POD_SUBPATH,
        volume=None,
        pod_uid=uid,
        problem=f"no volume {vol!r} under {volumes_dir}",
    )


def _csi_from_vol_data(path: str) -> tuple[VolumeIdentity | None, str]:
    """The CSI identity recorded in a ``vol_data.json``, or None and why not."""
    try:
        data = load_json_file(path)
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable: {exc}"
    driver = data.get("driverName") if isinstance(data, dict) else None
    handle = data.get("volumeHandle") if isinstance(data, dict) else None
    if not isinstance(driver, str) or not isinstance(handle, str) or not driver or not handle:
        return None, f"{path} lacks driverName or volumeHandle"
    return csi_identity(driver, sha256_hex(handle), handle), ""
