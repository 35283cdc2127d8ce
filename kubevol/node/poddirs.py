"""Pod volume directories (``pods/<uid>/{volumes,volumeDevices}/<plugin>/<name>``): listing
them, and the hygiene of taking them away: what an interrupted tear-down leaves, and a gone
pod's directory. Nothing here deletes through a mount: ``rmdir`` and ``unlink`` of what the
plugin says is its own, only once nothing is mounted.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable

import attrs

from kubevol import layout
from kubevol.layout import PodVolumeEntry
from kubevol.mount.helpers import empty_tree_on_one_device, is_corrupted_error
from kubevol.mount.interface import MountInterface
from kubevol.node.mountcheck import STILL_MOUNTED, MountCheck, check_mount
from kubevol.node.state import VolumeMode
from kubevol.plugin import VolumePlugin
from kubevol.util import fdtree

log = logging.getLogger(__name__)

_MODE_DIRS = (
    (layout.POD_VOLUMES_DIR, VolumeMode.FILESYSTEM),
    (layout.POD_VOLUME_DEVICES_DIR, VolumeMode.BLOCK),
)


@attrs.frozen(kw_only=True)
class PodVolumeDir:
    """One entry of a pod's ``volumes`` or ``volumeDevices`` directory."""

    pod_uid: str
    plugin_name: str
    spec_name: str
    path: str
    mode: VolumeMode


def list_pod_volume_dirs(
    pods_dir: str, pod_uids: Iterable[str] | None = None
) -> list[PodVolumeDir]:
    """Every ``pods/<uid>/{volumes,volumeDevices}/<plugin>/<name>`` entry, sorted.

    Only reads directories; a missing ``pods_dir`` gives ``[]``. ``pod_uids`` limits the
    walk to those pods.
    """
    if pod_uids is not None:
        pods = [(uid, os.path.join(pods_dir, uid)) for uid in sorted(pod_uids)]
    else:
        pods = _list_dirs(pods_dir, dirs_only=True)
    out: list[PodVolumeDir] = []
    for uid, pod_dir in pods:
        for kind, mode in _MODE_DIRS:
            for escaped, plugin_dir in _list_dirs(f"{pod_dir}/{kind}", dirs_only=True):
                plugin = layout.unescape_plugin_name(escaped)
                for name, path in _list_dirs(plugin_dir, dirs_only=False):
                    out.append(
                        PodVolumeDir(
                            pod_uid=uid, plugin_name=plugin, spec_name=name, path=path, mode=mode
                        )
                    )
    return out


def _list_dirs(path: str, *, dirs_only: bool) -> list[tuple[str, str]]:
    """(name, path) of the entries of ``path`` (only directories with ``dirs_only``),
    sorted by name; ``[]`` when ``path`` is missing or a corrupted mount."""
    try:
        with os.scandir(path) as entries:
            found = [
                (e.name, e.path)
                for e in entries
                if not dirs_only or e.is_dir(follow_symlinks=False)
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        if is_corrupted_error(exc):
            log.warning("reconstruct: %s is a corrupted mount, skipped", path)
            return []
        raise
    found.sort()
    return found


def pod_dir_of(volume_dir: str) -> str:
    """``pods/<uid>`` of a pod volume directory ``pods/<uid>/volumes/<plugin>/<volume>``."""
    return os.path.dirname(os.path.dirname(os.path.dirname(volume_dir)))


def list_entries(path: str) -> list[str]:
    """The names in directory ``path``; ``[]`` when it is missing or not a directory."""
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def entry_kind(plugin: VolumePlugin | None, name: str) -> PodVolumeEntry:
    """What ``name`` in a pod volume directory of ``plugin`` is; pod data when the plugin is
    unknown (``None``)."""
    return plugin.pod_volume_entry(name) if plugin is not None else PodVolumeEntry.DATA


def only_leftovers(path: str, mounter: MountInterface, plugin: VolumePlugin | None) -> bool:
    """Whether the pod volume directory ``path`` of ``plugin`` holds nothing but what a
    tear-down leaves when interrupted: the plugin's metadata and empty, unmounted
    directories it mounts at (the plugin's :meth:`~VolumePlugin.pod_volume_entry` says
    which names those are)."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if check_mount(mounter, path) in STILL_MOUNTED:
        return False
    for name in names:
        entry = entry_kind(plugin, name)
        if entry is PodVolumeEntry.METADATA:
            continue
        sub = os.path.join(path, name)
        if entry is not PodVolumeEntry.MOUNT_DIR or os.path.islink(sub) or not os.path.isdir(sub):
            return False
        if check_mount(mounter, sub) is not MountCheck.NOT_MOUNTED or os.listdir(sub):
            return False
    return True


def remove_volume_dir_leftovers(
    path: str, mounter: MountInterface, plugin: VolumePlugin | None
) -> None:
    """Remove a pod volume directory that :func:`only_leftovers` approves: the plugin's
    metadata files, its empty mount directories, itself. Anything else stops it with
    ``OSError`` before pod data could be touched (``rmdir`` only)."""
    if not os.path.isdir(path):
        return
    if not only_leftovers(path, mounter, plugin):
        raise OSError(errno.ENOTEMPTY, f"{path} holds more than a plugin's leftovers")
    for name in os.listdir(path):
        sub = os.path.join(path, name)
        if entry_kind(plugin, name) is PodVolumeEntry.METADATA:
            os.unlink(sub)
        else:
            os.rmdir(sub)
    os.rmdir(path)


def remove_pod_dir(pod_dir: str) -> bool:
    """Remove a gone pod's directory; True when it is gone.

    Refused (False) while any volume directory or device link is left under ``volumes``,
    ``volumeDevices`` or ``volume-subpaths``, or anything under it is a mount point: nothing
    is ever deleted through a mount. Everything is reached through directory descriptors
    opened without following links (:mod:`kubevol.util.fdtree`): a link at the pod directory or
    at one of its kind directories is refused, and what it points to is left untouched.
    """
    if not os.path.lexists(pod_dir):
        return True
    pods_dir = os.path.dirname(pod_dir.rstrip("/"))
    try:
        with fdtree.opened_with_parent(pod_dir, beneath=pods_dir) as (pods_fd, uid, pod_fd):
            if not _remove_empty_plugin_dirs(pod_fd, pod_dir):
                return False
            # The descriptor opened for the check serves the removal: not opened again.
            empty_tree_on_one_device(pod_fd, pod_dir)
            os.rmdir(uid, dir_fd=pods_fd)
    except OSError as exc:
        log.warning("cannot remove pod directory %s: %s", pod_dir, exc)
        return False
    return True


def _remove_empty_plugin_dirs(pod_fd: int, pod_dir: str) -> bool:
    """Remove the plugin directories under the pod's ``volumes``, ``volumeDevices`` and
    ``volume-subpaths``; False (logged) when one is not empty: a volume is left."""
    for kind in layout.POD_VOLUME_KINDS:
        try:
            kind_fd = fdtree.open_dir_at(pod_fd, kind, os.path.join(pod_dir, kind))
        except FileNotFoundError:
            continue
        try:
            for name in os.listdir(kind_fd):
                os.rmdir(name, dir_fd=kind_fd)  # only when empty
        except OSError:
            log.info("pod directory %s still holds something under %s", pod_dir, kind)
            return False
        finally:
            os.close(kind_fd)
    return True
