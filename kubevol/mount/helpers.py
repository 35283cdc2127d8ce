"""Mount-point helpers shared by every mounter: corrupted-mount detection, the Kubernetes
mount-reference search, and a cleanup that never deletes through a mount point."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
from typing import TYPE_CHECKING

from kubevol.errors import CorruptedMountError, MountError
from kubevol.mount.mountread import PROC_MOUNTINFO, read_mountinfo_bytes
from kubevol.mount.table import MountTable, MountTableCache
from kubevol.util import fdtree

if TYPE_CHECKING:
    from kubevol.mount.interface import MountInterface

log = logging.getLogger(__name__)

#: errno values a path answers with when the filesystem mounted on it no longer responds
#: (Kubernetes' ``IsCorruptedMnt``).
CORRUPTED_MOUNT_ERRNOS = frozenset(
    {
        errno.ENOTCONN,
        errno.ESTALE,
        errno.EIO,
        errno.EACCES,
        errno.EHOSTDOWN,
        errno.EWOULDBLOCK,
        errno.ENODEV,
    }
)


def is_corrupted_error(err: BaseException | None) -> bool:
    """True when ``err`` is an ``OSError`` whose errno means a corrupted mount."""
    return isinstance(err, OSError) and err.errno in CORRUPTED_MOUNT_ERRNOS


def path_exists(path: str) -> bool:
    """Whether ``path`` exists, telling a corrupted mount apart from other failures.

    Returns False when it does not exist. Raises
    :class:`~kubevol.errors.CorruptedMountError` (it exists, but its filesystem no longer
    answers) or the original ``OSError`` for any other failure.
    """
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if is_corrupted_error(exc):
            raise CorruptedMountError(
                exc.errno, f"corrupted mount at {path!r}: {exc.strerror}"
            ) from exc
        raise
    return True


def is_corrupted_mount(path: str) -> bool:
    """True when ``path`` exists but its filesystem answers with a corrupted-mount errno."""
    try:
        os.stat(path)
    except OSError as exc:
        return is_corrupted_error(exc)
    return False


def search_mount_points(table: MountTable, path: str) -> list[str]:
    """Kubernetes' ``SearchMountPoints``: the other mount points showing what ``path`` shows.

    Finds the last mount containing ``path``, takes its root joined with ``path``'s place
    under the mount point, and returns every other entry with that exact root and the same
    major:minor, in table order. ``path`` must be absolute and already resolved.
    Raises :class:`~kubevol.errors.MountError` when no mount contains ``path``.
    """
    entry = table.find_containing(path)
    if entry is None:
        raise MountError(f"failed to get root path and major:minor for {path}")
    root = posixpath.normpath(
        posixpath.join(entry.root, posixpath.relpath(path, entry.mount_point))
    )
    return [
        e.mount_point
        for e in table.with_device(entry.major, entry.minor, root)
        if e.id != entry.id
    ]


def get_mount_refs(
    path: str, *, mountinfo_path: str = PROC_MOUNTINFO, cache: MountTableCache | None = None
) -> list[str]:
    """Kubernetes' ``GetMountRefs``: ``[]`` for a missing or corrupted path, else
    :func:`search_mount_points` on the resolved path.

    Raises the ``OSError`` of any other failure to check the path, and
    :class:`~kubevol.errors.MountError` when the mount table cannot be read.
    """
    try:
        if not path_exists(path):
            return []
    except OSError as exc:
        if is_corrupted_error(exc):
            log.warning("mount refs: corrupted mount at %s, treated as unmounted", path)
            return []
        raise
    table = cache.table() if cache is not None else MountTable(read_mountinfo_bytes(mountinfo_path))
    return search_mount_points(table, os.path.realpath(path))


def cleanup_mount_point(
    path: str, mounter: MountInterface, *, extensive_check: bool = False
) -> None:
    """Unmount ``path`` if it is mounted, then remove the (now empty) directory.

    Idempotent: a missing path is success. A corrupted mount is unmounted first. After an
    unmount the path is checked again and must no longer be a mount point. The directory is
    removed with ``rmdir`` only, never recursively: whatever an unmount failed to detach, or
    any file left in the directory, stays where it was and the call raises
    :class:`~kubevol.errors.MountError`. ``extensive_check`` uses the mount table
    (:meth:`MountInterface.is_mount_point`) instead of the fast device-number check, which misses
    bind mounts of the same filesystem.
    """
    try:
        if not path_exists(path):
            log.debug("cleanup: %s does not exist, nothing to do", path)
            return
        corrupted = False
    except OSError as exc:
        if not is_corrupted_error(exc):
            raise MountError(exc.errno, f"cannot check mount point {path!r}: {exc}") from exc
        corrupted = True

    if corrupted or _is_mounted(path, mounter, extensive_check):
        mounter.unmount(path)
        if _is_mounted(path, mounter, extensive_check):
            raise MountError(f"{path!r} is still mounted after unmounting it; left in place")
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise MountError(
            exc.errno, f"cannot remove mount point {path!r}: {exc.strerror}; left in place"
        ) from exc


def _is_mounted(path: str, mounter: MountInterface, extensive_check: bool) -> bool:
    if extensive_check:
        return mounter.is_mount_point(path)
    try:
        return not mounter.is_likely_not_mount_point(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if is_corrupted_error(exc):
            return True
        raise MountError(exc.errno, f"cannot check mount point {path!r}: {exc}") from exc


def remove_tree_on_one_device(path: str, *, beneath: str | None = None) -> None:
    """Delete directory ``path`` and everything under it, never through a link or a mount.

    A volume's directory may be written by a workload while it is deleted, and may have
    something mounted below it. The tree is walked and changed through directory
    descriptors (:mod:`kubevol.util.fdtree`): a sub-directory swapped for a symbolic link during
    the removal loses the link, never the link's target. A mount point inside makes the call
    raise :class:`~kubevol.errors.MountError` before anything is deleted (one that appears
    during the removal stops it there). ``path`` itself (and, with ``beneath``, every
    component of it below ``beneath``) must be a directory, not a link to one:
    :class:`~kubevol.errors.UnsafePathError`, nothing deleted. ``FileNotFoundError`` when
    ``path`` does not exist.
    """
    with fdtree.opened_with_parent(path, beneath=beneath) as (parent_fd, name, top_fd):
        empty_tree_on_one_device(top_fd, path)
        os.rmdir(name, dir_fd=parent_fd)


def empty_tree_on_one_device(top_fd: int, path: str) -> None:
    """Delete everything under the directory ``top_fd`` (``path``, for messages), as
    :func:`remove_tree_on_one_device` does; the caller keeps ``top_fd`` and the directory."""
    top = posixpath.normpath(path)
    #: A descriptor of every directory under the top, by path, for the deletion.
    kept: dict[str, int] = {}
    try:
        removals = _walk_before_deleting(top_fd, top, kept)
        if removals is not None and _delete_listed(removals, {top: top_fd, **kept}):
            return
    finally:
        for fd in kept.values():
            os.close(fd)
    # Too many directories to keep open, or the tree grew since it was walked: walk it again
    # and delete what is met.
    for entry in fdtree.walk(top_fd, path):
        if entry.parent_fd >= 0:  # not the top: the caller's
            _remove_entry(entry.name, entry.parent_fd, entry.is_dir)


#: ``(directory, name, is_dir)`` of every entry under a tree, children before parents.
_Removals = list[tuple[str, str, bool]]


def _walk_before_deleting(top_fd: int, top: str, kept: dict[str, int]) -> _Removals | None:
    """Walk the whole tree before anything is deleted: a mount point in it raises
    :class:`~kubevol.errors.MountError`. Returns what was met, and puts in ``kept`` (the
    caller closes them) a duplicate descriptor of every directory under the top, by path:
    one call each instead of a second walk of the tree. None when the tree has more
    directories than :data:`kubevol.util.fdtree.OPEN_DIRS`, which are not all kept open."""
    removals: _Removals = []
    too_many = False
    for entry in fdtree.walk(top_fd, top):
        if entry.parent_fd < 0 or too_many:
            continue  # the top, or too many: walked on for its mounts only
        if entry.is_dir:
            if len(kept) >= fdtree.OPEN_DIRS:
                too_many = True
                continue
            kept[entry.path] = os.dup(entry.fd)
        removals.append((posixpath.dirname(entry.path), entry.name, entry.is_dir))
    return None if too_many else removals


def _delete_listed(removals: _Removals, dirs: dict[str, int]) -> bool:
    """Delete what :func:`_walk_before_deleting` met, through the directories ``dirs``
    (the top's and those kept); False when a directory is no longer empty (something was
    added since: walk again)."""
    for directory, name, is_dir in removals:
        try:
            _remove_entry(name, dirs[directory], is_dir)
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                return False
            raise
    return True


def _remove_entry(name: str, dir_fd: int, is_dir: bool) -> None:
    """rmdir or unlink ``name`` in ``dir_fd``; one removed meanwhile (by whoever writes the
    tree) is fine."""
    with contextlib.suppress(FileNotFoundError):
        if is_dir:
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
