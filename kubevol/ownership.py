"""fsGroup ownership of a volume's files (Kubernetes' ``SetVolumeOwnership``)."""

from __future__ import annotations

import os
import stat

from kubevol.types import FSGroupChangePolicy

_RW_GROUP = 0o660  # the kubelet adds these bits (owner and group read/write)
_RO_GROUP = 0o440
_EXEC_GROUP = 0o110


def _required_bits(mode: int, read_only: bool) -> int:
    bits = _RO_GROUP if read_only else _RW_GROUP
    if stat.S_ISDIR(mode):
        bits |= stat.S_ISGID | _EXEC_GROUP
    return bits


def _root_matches(directory: str, fs_group: int, read_only: bool) -> bool:
    st = os.stat(directory)
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
    Nothing happens when ``fs_group`` is None. Returns whether a walk was done. Raises
    ``OSError`` naming the path that could not be changed.
    """
    if fs_group is None:
        return False
    if policy is FSGroupChangePolicy.ON_ROOT_MISMATCH and _root_matches(
        directory, fs_group, read_only
    ):
        return False
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in [*dirnames, *filenames]:
            _own(os.path.join(dirpath, name), fs_group, read_only)
        _own(dirpath, fs_group, read_only)
    return True


def _own(path: str, fs_group: int, read_only: bool) -> None:
    st = os.lstat(path)
    os.lchown(path, -1, fs_group)
    if stat.S_ISLNK(st.st_mode):
        return
    os.chmod(path, stat.S_IMODE(st.st_mode) | _required_bits(st.st_mode, read_only))
