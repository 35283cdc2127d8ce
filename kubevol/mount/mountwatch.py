"""Has a mount been attached or moved in this mount namespace since the last look?

Linux 6.15 reports mount-tree changes through fanotify (``FAN_REPORT_MNT`` groups with a
``FAN_MARK_MNTNS`` mark): one event per mount, ``FAN_MNT_DETACH`` for a mount that left the
namespace and ``FAN_MNT_ATTACH`` for one that joined it; a mount that moved (``move_mount``,
a parent unmounted under it, ``pivot_root``) is reported with both bits. The kernel queues
the event before the mount call returns.

So a mount table read after a look, with nothing but detaches reported since, lists every
mount present now, at its place, plus perhaps some that are gone: a superset. A check that
counts every listed mount as a reason to refuse (who still uses a volume, who references a
device) can decide "go ahead" on such a table exactly as on a fresh one, and needs a fresh
read only to confirm a refusal. That turns a read of the whole table (tens of microseconds
per line: the kernel formats every path) into a look at a few queued events, while the
tree only shrinks, as it does when pods are torn down.

The events do not report option or propagation changes; users of a superset table must
not depend on them. Where the kernel lacks mount events or the process may not watch
(``CAP_SYS_ADMIN`` is needed), :meth:`AttachWatch.open` returns None and callers read the
table as before.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import weakref

from kubevol.util import clib
from kubevol.util.lifecycle import ClosesOnExit

# include/uapi/linux/fanotify.h
_FAN_CLOEXEC = 0x1
_FAN_NONBLOCK = 0x2
_FAN_REPORT_MNT = 0x4000
_FAN_MARK_ADD = 0x1
_FAN_MARK_MNTNS = 0x110
_FAN_MNT_ATTACH = 0x01000000
_FAN_MNT_DETACH = 0x02000000
#: struct fanotify_event_metadata: event_len, vers, reserved, metadata_len, mask, fd, pid.
_METADATA = struct.Struct("=IBBHQii")
_NS_PATH = "/proc/self/ns/mnt"
_READ_SIZE = 65536


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = clib.libc()
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [
        ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p,
    ]  # fmt: skip
    return libc


class AttachWatch(ClosesOnExit):
    """Watches this process's mount namespace for mounts attached or moved. Not
    thread-safe: its user serialises the calls (a :class:`~kubevol.mount.table.MountTableCache`
    does, under its lock)."""

    def __init__(self, fd: int, namespace: int) -> None:
        self._fd = fd
        self._namespace = namespace
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls) -> AttachWatch | None:
        """A watch on the current mount namespace, or None when this kernel has no mount
        events (before 6.15: ``EINVAL``) or the process may not watch (``EPERM``)."""
        try:
            libc = _libc()
            namespace = os.stat(_NS_PATH).st_ino
        except (OSError, AttributeError):  # no C library symbol, no /proc
            return None
        fd = libc.fanotify_init(_FAN_REPORT_MNT | _FAN_NONBLOCK | _FAN_CLOEXEC, os.O_RDONLY)
        if fd < 0:
            return None
        try:
            ns_fd = os.open(_NS_PATH, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(fd)
            return None
        try:
            marked = libc.fanotify_mark(
                fd, _FAN_MARK_ADD | _FAN_MARK_MNTNS, _FAN_MNT_ATTACH | _FAN_MNT_DETACH, ns_fd,
                None,
            ) == 0  # fmt: skip
        finally:
            os.close(ns_fd)
        if not marked:
            os.close(fd)
            return None
        return cls(fd, namespace)

    def attached(self) -> bool:
        """Takes every event queued since the last call; True if any says a mount was
        attached or moved, the queue overflowed, or the process is no longer in the
        namespace watched (so only a table read after this call is known complete)."""
        seen = False
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError:  # closed, or the kernel refuses: assume the worst
                return True
            offset = 0
            while offset + _METADATA.size <= len(data):
                length, _, _, _, mask, _, _ = _METADATA.unpack_from(data, offset)
                # Anything but a plain detach (an attach, a move, an overflow) may add.
                seen = seen or mask != _FAN_MNT_DETACH
                offset += max(length, _METADATA.size)
        try:
            moved = os.stat(_NS_PATH).st_ino != self._namespace
        except OSError:
            moved = True
        return seen or moved

    def close(self) -> None:
        """Stop watching. Idempotent."""
        self._closer()
