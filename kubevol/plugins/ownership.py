"""fsGroup ownership of a volume's files (Kubernetes' ``SetVolumeOwnership``)."""

from __future__ import annotations

import os
import stat

from kubevol.types import FSGroupChangePolicy
from kubevol.util import fdtree

_RW_GROUP = 0o660  # the kubelet adds these bits (owner and group read/write)
_RO_GROUP = 0o440
_EXEC_GROUP = 0o110


def _required_bits(mode: int, read_only: bool) -> int:
    bits = _RO_GROUP if read_only else _RW_GROUP
    if stat.S_ISDIR(mode):
        bits |= stat.S_ISGID | _EXEC_GROUP
    return bits


def _root_matches(st: os.stat_result, fs_group: int, read_only: bool) -> bool:
    required = _required_bits(st.st_mode, read_only)
    return st.st_gid == fs_group and (st.st_mode & required) == required


def set_volume_ownership(
    directory: str,
    fs_group: int | None,
    policy: FSGroupChangePolicy | None = None,
    *,
    read_only: bool = False,
) -> bool:
    """Give ``fs_group`` group ownership of everything under ``directory``.

    Every entry gets group ``fs_group`` and group read/write (read-only: read) bits;
    directories also get setgid and group execute, so new files inherit the group.
    Symbolic links are re-owned but never followed or chmod-ed. With policy
    ``OnRootMismatch`` the walk is skipped when the root already has the group and bits.
    Nothing happens when ``fs_group`` is None. Returns whether a walk was done.

    The workload may be writing the volume meanwhile: the walk goes through directory
    descriptors and changes every entry relative to its directory without following it
    (:mod:`kubevol.util.fdtree`), so a directory swapped for a link is re-owned as a link, never
    through it; directories of other mounts below ``directory`` are left alone. Raises
    :class:`~kubevol.errors.UnsafePathError` (nothing changed) when ``directory`` is a link,
    and ``OSError`` naming the path that could not be changed.
    """
    if fs_group is None:
        return False
    top_fd = fdtree.open_dir(directory)
    try:
        if policy is FSGroupChangePolicy.ON_ROOT_MISMATCH and _root_matches(
            os.fstat(top_fd), fs_group, read_only
        ):
            return False
        for entry in fdtree.walk(top_fd, directory, mounts=fdtree.MountPolicy.SKIP):
            try:
                _own(entry, fs_group, read_only)
            except FileNotFoundError:
                continue  # removed meanwhile by the workload
            except OSError as exc:
                raise OSError(exc.errno, f"cannot set fsGroup ownership: {exc.strerror}",
                              entry.path) from exc
    finally:
        os.close(top_fd)
    return True


def _own(entry: fdtree.TreeEntry, fs_group: int, read_only: bool) -> None:
    mode = stat.S_IMODE(entry.st.st_mode) | _required_bits(entry.st.st_mode, read_only)
    if entry.is_dir:
        os.fchown(entry.fd, -1, fs_group)
        os.fchmod(entry.fd, mode)
        return
    os.chown(entry.name, -1, fs_group, dir_fd=entry.parent_fd, follow_symlinks=False)
    if not stat.S_ISLNK(entry.st.st_mode):
        _chmod_nofollow(entry.parent_fd, entry.name, mode)


def _chmod_nofollow(dir_fd: int, name: str, mode: int) -> None:
    """``fchmodat(dir_fd, name, mode, AT_SYMLINK_NOFOLLOW)``: a link swapped in since the
    walk looked is left as it is, never followed."""
    try:
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)
        return
    except (NotImplementedError, ValueError):
        # Python reports the C library's EOPNOTSUPP (a link, or a C library that cannot
        # chmod without following) as ValueError: ask the kernel about the entry itself.
        pass
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            return  # a link: its mode means nothing
        os.chmod(f"/proc/self/fd/{fd}", mode)  # the very inode opened, whatever its name now
    finally:
        os.close(fd)
