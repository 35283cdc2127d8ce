"""Mapping a block device into a pod, as the kubelet's operation executor does
(``MapBlockVolume``/``UnmapBlockVolume``): a bind of the device node at
``<global map path>/<pod uid>`` keeps the device referenced per pod, and a symbolic link
``<pod device dir>/<volume>`` is what the pod opens."""

from __future__ import annotations

import contextlib
import os

from kubevol.errors import MountError
from kubevol.mount.helpers import is_corrupted_error
from kubevol.mount.interface import MountInterface


def map_block_device(
    mounter: MountInterface,
    *,
    device_path: str,
    global_map_path: str,
    pod_device_dir: str,
    volume_map_name: str,
    pod_uid: str,
) -> None:
    """Bind ``device_path`` at ``<global_map_path>/<pod_uid>`` and link
    ``<pod_device_dir>/<volume_map_name>`` to it. Idempotent.

    A link pointing elsewhere is replaced (the device path can change across a restart);
    anything at the link's place that is not a link is refused with MountError.
    """
    os.makedirs(global_map_path, mode=0o750, exist_ok=True)
    bind = os.path.join(global_map_path, pod_uid)
    if not os.path.lexists(bind):
        with open(bind, "a"):
            pass
    if not mounter.is_mount_point(bind):
        mounter.mount(device_path, bind, "", ["bind"])
    os.makedirs(pod_device_dir, mode=0o750, exist_ok=True)
    link = os.path.join(pod_device_dir, volume_map_name)
    if os.path.islink(link):
        if os.readlink(link) == device_path:
            return
        os.unlink(link)
    elif os.path.lexists(link):
        raise MountError(f"cannot map block volume: {link} exists and is not a symbolic link")
    os.symlink(device_path, link)


def unmap_block_device(
    mounter: MountInterface,
    *,
    global_map_path: str,
    pod_device_dir: str,
    volume_map_name: str,
    pod_uid: str,
) -> None:
    """Undo :func:`map_block_device`: unmount and remove the bind, then remove the pod's
    link, last: the link is what tells a later run that something is left to undo.
    Idempotent; a corrupted bind (the device went away) is unmounted too."""
    bind = os.path.join(global_map_path, pod_uid)
    try:
        mounted = not mounter.is_likely_not_mount_point(bind)
    except FileNotFoundError:
        mounted = False
    except OSError as exc:
        if not is_corrupted_error(exc):
            raise
        mounted = True
    while mounted:
        mounter.unmount(bind)
        mounted = mounter.is_mount_point(bind)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(bind)
    link = os.path.join(pod_device_dir, volume_map_name)
    if os.path.islink(link):
        os.unlink(link)


def mapped_pods(mounter: MountInterface, global_map_path: str) -> list[str]:
    """The pod UIDs whose bind of the device (:func:`map_block_device`) is still mounted
    under ``global_map_path``, sorted; ``[]`` when the directory is gone."""
    try:
        names = sorted(os.listdir(global_map_path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    refs = []
    for name in names:
        path = os.path.join(global_map_path, name)
        try:
            if not mounter.is_likely_not_mount_point(path):
                refs.append(name)
        except FileNotFoundError:
            continue
    return refs


def remove_global_map_path(global_map_path: str) -> None:
    """Remove the global map directory once no pod maps the device: its plain files (the
    unmounted bind targets) and itself. A file still mounted stays, and the directory with
    it: MountError. Idempotent."""
    try:
        names = os.listdir(global_map_path)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(global_map_path, name)
        if os.path.isfile(path) and not os.path.ismount(path):
            os.unlink(path)
    try:
        os.rmdir(global_map_path)
    except OSError as exc:
        raise MountError(
            exc.errno, f"cannot remove the global map path {global_map_path!r}: {exc.strerror}"
        ) from exc
