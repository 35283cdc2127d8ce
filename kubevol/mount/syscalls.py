"""mount(2) and umount2(2) through the C library, for the mounts where the kernel call is all
that mount(8) would do: binds, remounts, tmpfs.

Forking mount(8) costs many times the call itself, and a node agent or a driver makes
several per volume. mount(8) stays the way for everything else
(filesystems with ``mount.<type>`` helpers, loop set-up, options only libmount knows);
:func:`mount_call` says when a request can go to the kernel directly.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Sequence

import attrs

from kubevol.util import clib

# Flags of mount(2) (include/uapi/linux/mount.h).
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_SYNCHRONOUS = 16
MS_REMOUNT = 32
MS_DIRSYNC = 128
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24

# Flags of umount2(2).
MNT_FORCE = 1
MNT_DETACH = 2

#: Per-mount flags as statvfs(3) reports them (``f_flag``), and the mount(2) flag of each.
_ST_TO_MS = (
    (os.ST_RDONLY, MS_RDONLY),
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_SYNCHRONOUS, MS_SYNCHRONOUS),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)

#: Options that set a flag, and options that clear one (mount(8)'s names).
_SETS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "sync": MS_SYNCHRONOUS,
    "dirsync": MS_DIRSYNC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
_CLEARS = {
    "rw": MS_RDONLY,
    "suid": MS_NOSUID,
    "dev": MS_NODEV,
    "exec": MS_NOEXEC,
    "async": MS_SYNCHRONOUS,
    "atime": MS_NOATIME,
    "diratime": MS_NODIRATIME,
    "norelatime": MS_RELATIME,
}
_ATIME_MODES = MS_NOATIME | MS_RELATIME | MS_STRICTATIME

#: Filesystems that need nothing but the kernel: mount(8) has no helper to run for them.
KERNEL_ONLY_FSTYPES = frozenset({"tmpfs", "ramfs"})
#: tmpfs' own options (mm/shmem.c), passed to the kernel as the data string.
_TMPFS_DATA_KEYS = frozenset(
    {"size", "nr_blocks", "nr_inodes", "mode", "uid", "gid", "huge", "mpol", "inode32",
     "inode64", "noswap", "quota", "usrquota", "grpquota"}
)


@attrs.frozen(kw_only=True)
class MountCall:
    """What to pass to mount(2) for one mount(8)-style request."""

    #: ``bind`` requests are a bind, then (when flags were asked) a remount of the bind.
    bind: bool
    flags: int
    #: Flags the request clears (``rw``, ``exec``...) on a bind's remount.
    cleared: int
    data: str


def mount_call(fstype: str, options: Sequence[str]) -> MountCall | None:
    """The direct call for ``mount [-t fstype] -o options``, or None when only mount(8) can do
    it (another filesystem type, or an option mount(8) itself interprets)."""
    opts = [o for o in options if o and o != "defaults"]
    bind = "bind" in opts
    if bind:
        if fstype or "remount" in opts:
            return None
        opts = [o for o in opts if o != "bind"]
    elif fstype not in KERNEL_ONLY_FSTYPES or "remount" in opts:
        return None
    flags = cleared = 0
    data = []
    for option in opts:
        if option in _SETS:
            flags |= _SETS[option]
            cleared &= ~_SETS[option]
        elif option in _CLEARS:
            cleared |= _CLEARS[option]
            flags &= ~_CLEARS[option]
        elif not bind and option.partition("=")[0] in _TMPFS_DATA_KEYS:
            data.append(option)
        else:
            return None
    return MountCall(bind=bind, flags=flags, cleared=cleared, data=",".join(data))


def mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    """mount(2). Raises ``OSError`` with the kernel's errno."""
    rc = _libc().mount(
        os.fsencode(source), os.fsencode(target), os.fsencode(fstype) or None, flags,
        os.fsencode(data) or None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def bind(source: str, target: str, call: MountCall) -> None:
    """Bind ``source`` at ``target``, then remount the bind with ``call``'s flags, keeping the
    per-mount flags the bind inherited (nosuid, nodev... which a remount would otherwise
    drop, and which the kernel refuses to drop when they are locked). When the remount
    fails the bind is undone. Raises ``OSError``."""
    mount(source, target, "", MS_BIND)
    if not call.flags and not call.cleared:
        return
    try:
        inherited = mount_flags(target)
        if call.flags & _ATIME_MODES:
            inherited &= ~_ATIME_MODES
        flags = (inherited | call.flags) & ~call.cleared
        mount("", target, "", MS_REMOUNT | MS_BIND | flags)
    except OSError:
        umount(target, MNT_DETACH)
        raise


def mount_flags(path: str) -> int:
    """The per-mount flags of the mount at ``path`` (statvfs), as mount(2) flags."""
    st_flags = os.statvfs(path).f_flag
    return functools.reduce(lambda acc, pair: acc | (pair[1] if st_flags & pair[0] else 0),
                            _ST_TO_MS, 0)


def umount(target: str, flags: int = 0) -> bool:
    """umount2(2). Returns False when ``target`` is not a mount point (EINVAL), True when
    it was unmounted. Raises ``OSError`` for anything else (ENOENT, EBUSY...)."""
    rc = _libc().umount2(os.fsencode(target), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EINVAL:
        return False
    raise OSError(err, os.strerror(err), target)


@functools.cache  # the prototypes, set once
def _libc() -> ctypes.CDLL:
    libc = clib.libc()
    libc.mount.argtypes = (
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p
    )
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    return libc
