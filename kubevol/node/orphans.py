"""Orphan device mounts: mounts under ``<root>/plugins/`` that no pod volume on disk leads
to (a crash between the last tear-down and the device unmount leaves one). Found here,
reported with the plugin owning them; the node volume manager unmounts them through the
unstage guard."""

from __future__ import annotations

import os
from collections.abc import Iterable

import attrs

from kubevol import layout
from kubevol.errors import KubevolError, PluginNotFoundError
from kubevol.manager import VolumePluginMgr
from kubevol.mount.table import MountTable
from kubevol.node.cleanup import NOT_TRIED, Cleanup
from kubevol.node.host import NodeVolumeHost
from kubevol.node.mountcheck import MountSnapshot


@attrs.frozen(kw_only=True)
class OrphanDeviceMount:
    """A mount under ``plugins/`` that no pod volume on disk leads to."""

    path: str
    plugin_name: str
    source: str
    fs_type: str
    #: ``device`` for a device (staging) mount, ``block`` for a mount of a block volume's
    #: layout (``plugins/<plugin>/volumeDevices/...``), which is reported, never unmounted.
    kind: str = "device"
    cleanup: Cleanup = NOT_TRIED


def find_orphan_device_mounts(
    host: NodeVolumeHost,
    mgr: VolumePluginMgr,
    *,
    claimed: Iterable[str] = (),
    block_names: Iterable[str] = (),
    mounts: MountSnapshot | None = None,
    table: MountTable | None = None,
) -> list[OrphanDeviceMount]:
    """Mounts under ``<root>/plugins/`` that no ``claimed`` device mount path (or global map
    path) leads to, nor the layout of a block volume named in ``block_names``.

    ``table`` (and ``mounts`` made from it) are a mount table already read; else the host's
    mounter gives it.
    """
    if table is None:
        table = host.get_mounter().table()
    if mounts is None:
        mounts = MountSnapshot(table, host.root_dir, host.probe)
    plugins_dir = os.path.join(os.path.realpath(host.root_dir), layout.PLUGINS_DIR)
    known = {mounts.real(p) for p in claimed if p}
    blocks = set(block_names)
    out: dict[str, OrphanDeviceMount] = {}
    # Only the lines under plugins/ (the snapshot already parsed the whole table once).
    for entry in table.mounted_under(plugins_dir):
        point = entry.mount_point
        if not layout.is_below(point, plugins_dir) or point in out:
            continue
        if _self_or_ancestor_in(point, known, plugins_dir):
            continue
        rel = point[len(plugins_dir) + 1 :].split("/")
        kind = "device"
        block = layout.block_segments(rel)
        if block is not None:
            # Staging, publish and map paths of block volumes are named by the volume's
            # spec name; those of a rebuilt block volume are its own.
            if blocks & set(block):
                continue
            kind = "block"
        out[point] = OrphanDeviceMount(
            path=point,
            plugin_name=_plugin_of(mgr, rel),
            source=entry.source,
            fs_type=entry.fs_type,
            kind=kind,
        )
    return list(out.values())


def _self_or_ancestor_in(path: str, paths: set[str], stop: str) -> bool:
    """Whether ``path`` or one of its ancestors below ``stop`` is in ``paths``."""
    while len(path) > len(stop):
        if path in paths:
            return True
        path = os.path.dirname(path)
    return False


def _plugin_of(mgr: VolumePluginMgr, segments: list[str]) -> str:
    """The registered plugin whose directory holds ``plugins/<segments>``, or ``""``."""
    for name in layout.plugin_name_candidates(segments):
        try:
            mgr.find_plugin_by_name(name)
        except PluginNotFoundError:
            continue
        except KubevolError:
            return ""
        return name
    return ""
