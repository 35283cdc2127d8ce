"""Which volume a path under the kubelet root belongs to, read from the kubelet's layout.

The kubelet (and kubevol) keep every mount they make in a fixed tree under the root::

    plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/globalmount    CSI device mount
    plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/vol_data.json  {driverName, volumeHandle}
    plugins/kubernetes.io/csi/pv/<pv>/globalmount                         CSI before v1.24
    plugins/kubernetes.io/csi/volumeDevices/{staging,publish}/<spec>/...  CSI block
    plugins/kubernetes.io/csi/volumeDevices/<spec>/data/vol_data.json
    plugins/<plugin>/...                                                  in-tree device mounts
    pods/<uid>/volumes/<plugin, / as ~>/<volume>[/mount]                  pod mounts
    pods/<uid>/volumes/kubernetes.io~csi/<volume>/vol_data.json           {driverName, ...}
    pods/<uid>/volumeDevices/<plugin, / as ~>/<volume>                    pod block devices
    pods/<uid>/volume-subpaths/<volume>/<container>/<index>               subPath bind mounts

A volume's identity is (driver, volume handle) for CSI and (plugin, volume name) otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath

import attrs

CSI_PLUGIN = "kubernetes.io/csi"
VOL_DATA_FILE = "vol_data.json"
#: The CSI adapter writes vol_data.json atomically through a temporary file named so; one
#: may be left behind when the writer is killed.
VOL_DATA_TEMP_PREFIX = ".vol_data."


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
    """What the layout says about one path under the kubelet root."""

    #: ``device-mount``, ``pod-volume``, ``pod-subpath``, ``block``.
    role: str
    #: None when the layout is recognised but the volume cannot be told (vol_data.json
    #: missing or unreadable); ``problem`` then says why.
    volume: VolumeIdentity | None
    pod_uid: str | None = None
    problem: str = ""


def csi_identity(driver: str, handle_hash: str, handle: str | None = None) -> VolumeIdentity:
    """Identity of a CSI volume from its driver and ``sha256hex(handle)``."""
    shown = f"handle {handle!r}" if handle is not None else f"handle hash {handle_hash}"
    return VolumeIdentity(
        plugin=CSI_PLUGIN, name=f"{driver}^{handle_hash}", description=f"CSI {driver} {shown}"
    )


def sha256_hex(text: str) -> str:
    """``sha256hex`` as the CSI plugin names device mount directories."""
    return hashlib.sha256(text.encode()).hexdigest()


def unescape_plugin_name(segment: str) -> str:
    """``kubernetes.io~csi`` → ``kubernetes.io/csi`` (pod directories escape ``/`` as ``~``)."""
    return segment.replace("~", "/")


def describe(root_dir: str, rel: str) -> KubeletPath | None:
    """Attribute ``rel`` (a path relative to ``root_dir``) to a volume; None when it is not in
    a layout the kubelet uses. Reads the ``vol_data.json`` files the layout puts beside mounts.
    """
    segs = [s for s in rel.split("/") if s]
    if len(segs) >= 4 and segs[0] == "plugins":
        return _describe_plugin_dir(root_dir, segs)
    if len(segs) >= 5 and segs[0] == "pods":
        return _describe_pod_dir(root_dir, segs)
    return None


def _describe_plugin_dir(root: str, segs: list[str]) -> KubeletPath | None:
    plugin = f"{segs[1]}/{segs[2]}"
    if plugin != CSI_PLUGIN:
        # In-tree device mounts: plugins/<plugin>/.../<volume>[/globalmount].
        rest = [s for s in segs[3:] if s not in ("globalmount", "mount")]
        name = rest[-1] if rest else segs[3]
        return KubeletPath(
            role="device-mount",
            volume=VolumeIdentity(plugin=plugin, name=name, description=f"{plugin} {name}"),
        )
    if segs[3] == "volumeDevices" and len(segs) >= 5:
        if segs[4] in ("staging", "publish") and len(segs) >= 6:
            spec, pod = segs[5], (segs[6] if segs[4] == "publish" and len(segs) >= 7 else None)
        else:
            spec, pod = segs[4], None
        data = posixpath.join(root, "plugins", CSI_PLUGIN, "volumeDevices", spec, "data")
        volume, problem = _csi_from_vol_data(posixpath.join(data, VOL_DATA_FILE))
        return KubeletPath(role="block", volume=volume, pod_uid=pod, problem=problem)
    if len(segs) < 5:
        return None
    vol_dir = posixpath.join(root, *segs[:5])
    volume, problem = _csi_from_vol_data(posixpath.join(vol_dir, VOL_DATA_FILE))
    if volume is None and segs[3] != "pv":
        # The directory name itself is sha256hex(handle): enough to tell volumes apart.
        volume, problem = csi_identity(segs[3], segs[4]), ""
    return KubeletPath(role="device-mount", volume=volume, problem=problem)


def _describe_pod_dir(root: str, segs: list[str]) -> KubeletPath | None:
    uid, kind = segs[1], segs[2]
    if kind in ("volumes", "volumeDevices"):
        plugin = unescape_plugin_name(segs[3])
        vol = segs[4]
        role = "pod-volume" if kind == "volumes" else "block"
        return _pod_volume(root, uid, kind, plugin, vol, role=role)
    if kind == "volume-subpaths":
        vol = segs[3]
        volumes_dir = posixpath.join(root, "pods", uid, "volumes")
        try:
            plugin_dirs = sorted(os.listdir(volumes_dir))
        except OSError as exc:
            return KubeletPath(
                role="pod-subpath",
                volume=None,
                pod_uid=uid,
                problem=f"cannot list {volumes_dir}: {exc.strerror}",
            )
        for plugin_dir in plugin_dirs:
            if os.path.isdir(posixpath.join(volumes_dir, plugin_dir, vol)):
                found = _pod_volume(
                    root, uid, "volumes", unescape_plugin_name(plugin_dir), vol, role="pod-subpath"
                )
                return found
        return KubeletPath(
            role="pod-subpath",
            volume=None,
            pod_uid=uid,
            problem=f"no volume {vol!r} under {volumes_dir}",
        )
    return None


def _pod_volume(
    root: str, uid: str, kind: str, plugin: str, vol: str, *, role: str
) -> KubeletPath:
    if plugin != CSI_PLUGIN:
        identity = VolumeIdentity(plugin=plugin, name=vol, description=f"{plugin} {vol}")
        return KubeletPath(role=role, volume=identity, pod_uid=uid)
    if kind == "volumes":
        path = posixpath.join(root, "pods", uid, "volumes", "kubernetes.io~csi", vol, VOL_DATA_FILE)
    else:
        path = posixpath.join(
            root, "plugins", CSI_PLUGIN, "volumeDevices", vol, "data", VOL_DATA_FILE
        )
    volume, problem = _csi_from_vol_data(path)
    return KubeletPath(role=role, volume=volume, pod_uid=uid, problem=problem)


def _csi_from_vol_data(path: str) -> tuple[VolumeIdentity | None, str]:
    """The CSI identity recorded in a ``vol_data.json``, or None and why not."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable: {exc}"
    driver = data.get("driverName") if isinstance(data, dict) else None
    handle = data.get("volumeHandle") if isinstance(data, dict) else None
    if not isinstance(driver, str) or not isinstance(handle, str) or not driver or not handle:
        return None, f"{path} lacks driverName or volumeHandle"
    return csi_identity(driver, sha256_hex(handle), handle), ""
