"""Cleaning a pod volume that reconstruction could not rebuild: once, with the plugin's
tear-down when it can, else by unmounting and removing only what the plugin says is its
own. Data is never deleted through a mount."""

from __future__ import annotations

import os

from kubevol.layout import PodVolumeEntry
from kubevol.manager import VolumePluginMgr
from kubevol.mount.helpers import cleanup_mount_point
from kubevol.mount.interface import MountInterface
from kubevol.mount.subpath import clean_subpaths
from kubevol.node.cleanup import CLEANED, Cleanup
from kubevol.node.poddirs import (
    entry_kind,
    list_entries,
    pod_dir_of,
    remove_volume_dir_leftovers,
)
from kubevol.node.reconstruct import FailedVolume
from kubevol.node.state import VolumeMode
from kubevol.plugin import VolumePlugin


def clean_failed_volume(
    mgr: VolumePluginMgr, failed: FailedVolume, mounter: MountInterface
) -> Cleanup:
    """Clean a volume that could not be rebuilt, once; returns what was done.

    The plugin's unmounter tears it down when the plugin is known; otherwise, or when that
    fails, the directories the plugin mounts at (its :meth:`~VolumePlugin.pod_volume_entry`
    hook tells) and the directory itself are unmounted if mounted, and removed only if
    nothing but the plugin's leftovers remain. Data is never deleted through a mount.
    """
    d = failed.dir
    if d.mode is VolumeMode.BLOCK:
        try:
            if os.path.islink(d.path):
                os.unlink(d.path)
            return CLEANED
        except OSError as exc:
            return Cleanup.failed(f"cannot remove the device link {d.path}: {exc.strerror}")
    first_error = ""
    plugin: VolumePlugin | None = None
    try:
        # subPath binds go first, as before any tear-down.
        clean_subpaths(mounter, pod_dir_of(d.path), d.spec_name)
    except OSError as exc:
        return Cleanup.failed(f"cannot remove its subPath binds: {exc}")
    try:
        plugin = mgr.find_plugin_by_name(d.plugin_name)
        plugin.new_unmounter(d.spec_name, d.pod_uid).tear_down()
        if not os.path.lexists(d.path):
            return CLEANED
    except Exception as exc:  # the plugin could not: fall back to a plain unmount below
        first_error = f"{type(exc).__name__}: {exc}"
    try:
        for name in list_entries(d.path):
            if entry_kind(plugin, name) is PodVolumeEntry.MOUNT_DIR:
                cleanup_mount_point(os.path.join(d.path, name), mounter)
        if os.path.isdir(d.path) and not mounter.is_likely_not_mount_point(d.path):
            cleanup_mount_point(d.path, mounter)
        remove_volume_dir_leftovers(d.path, mounter, plugin)
    except OSError as exc:
        why = f"{exc}" + (f" (plugin tear-down: {first_error})" if first_error else "")
        return Cleanup.failed(why)
    return CLEANED
