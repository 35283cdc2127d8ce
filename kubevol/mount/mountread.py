"""Reading a mountinfo file whole, correctly while the table changes.

What a read of the kernel's table guarantees: mountinfo is a seq_file, and one read(2)
returns at most one buffer (a page) of lines, so a table of more than a few dozen mounts
takes many reads and no read of it is an atomic snapshot. Since Linux 5.8 (commit
9f6c61f96f2d, "proc/mounts: add cursor") the reader keeps its place in the namespace's mount
list: every mount that exists for the whole read is listed exactly once; one mounted or
unmounted meanwhile may or may not be. That is all any reader can get (the table may change
right after the last byte anyway), so one pass is a correct read however busy the node is,
and ``POLLPRI``, which reports *any* change since the last poll, is no reason to read again.
Re-reading until two reads agree, with a try limit (Kubernetes' ``ConsistentRead``, three
tries), fails on a node where containers mount and unmount all the time, which is why
mount-utils reads once on such kernels. Before 5.8 an unmount between two reads could make
the next read skip a mount that stayed; there, only a pass during which nothing changed is
complete, and the reader reads again, backing off, until it gets one.
"""

from __future__ import annotations

import functools
import os
import re
import select
import time

from kubevol.errors import MountError

#: This process's mount table.
PROC_MOUNTINFO = "/proc/self/mountinfo"

_READ_CHUNK = 1 << 16
#: Before Linux 5.8 only: how long to wait for a read during which the table did not change.
_SETTLE_TIMEOUT = 10.0
_SETTLE_FIRST_DELAY = 0.001
_SETTLE_MAX_DELAY = 0.05


def read_mountinfo_bytes(path: str = PROC_MOUNTINFO) -> bytes:
    """Read a whole mountinfo file. A proc table that changes during the read is still
    read correctly (see the module docstring): mount churn is never an error.

    Raises :class:`~kubevol.errors.MountError` when the file cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise MountError(exc.errno, f"cannot read mount table {path!r}: {exc.strerror}") from exc
    try:
        return MountinfoReader(fd, path).read()
    finally:
        os.close(fd)


@functools.cache  # the running kernel does not change; uname once per process
def kernel_reads_mountinfo_with_cursor() -> bool:
    """Whether the kernel keeps a cursor in the mount list between reads of mountinfo
    (Linux 5.8, commit 9f6c61f96f2d "proc/mounts: add cursor")."""
    match = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return match is not None and (int(match[1]), int(match[2])) >= (5, 8)


class MountinfoReader:
    """Reads an open mountinfo descriptor (see the module docstring for what a read of a
    changing table guarantees); knows whether the table changed since the last check."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        # Every unstage check opens a reader: no path resolution for the usual file.
        self.is_proc = path == PROC_MOUNTINFO or os.path.realpath(path).startswith("/proc/")
        self._poll = select.poll()
        self._poll.register(fd, select.POLLPRI | select.POLLERR)

    def changed(self) -> bool:
        """True if the kernel flagged a mount-table change since the last check (proc files);
        clears the flag."""
        events = self._poll.poll(0)
        return any(ev & (select.POLLPRI | select.POLLERR) for _, ev in events)

    def read(self) -> bytes:
        """The whole table; see the class docstring."""
        if not self.is_proc or kernel_reads_mountinfo_with_cursor():
            return self._read_once()
        delay = _SETTLE_FIRST_DELAY
        deadline = time.monotonic() + _SETTLE_TIMEOUT
        while True:
            self.changed()
            data = self._read_once()
            if not self.changed():
                return data
            if time.monotonic() >= deadline:
                raise MountError(
                    f"mount table {self.path!r} changed during every read for "
                    f"{_SETTLE_TIMEOUT:.0f} s (a kernel before 5.8 cannot list it while "
                    "it changes)"
                )
            time.sleep(delay)
            delay = min(delay * 2, _SETTLE_MAX_DELAY)

    def _read_once(self) -> bytes:
        try:
            os.lseek(self.fd, 0, os.SEEK_SET)
            # A regular file comes in one read of its size; proc files report size 0.
            # Asking for much more than is left costs a large allocation per call, so the
            # first read asks for the size and later ones for a modest chunk.
            size = os.fstat(self.fd).st_size
            chunks = []
            want = size or _READ_CHUNK
            while chunk := os.read(self.fd, want):
                chunks.append(chunk)
                want = _READ_CHUNK
        except OSError as exc:
            raise MountError(
                exc.errno, f"cannot read mount table {self.path!r}: {exc.strerror}"
            ) from exc
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
