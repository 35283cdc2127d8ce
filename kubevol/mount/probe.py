"""Calls that may block for ever below a mount point, made with a deadline.

Reading ``/proc/self/mountinfo`` never blocks; a ``stat``, ``statfs``, ``open`` or
``readdir`` below the mount point of a dead NFS, Lustre, CephFS or Gluster server, or of a
FUSE filesystem whose daemon is frozen, can block for ever, in the kernel, where no signal
but a fatal one ends it (kubernetes#31272: one hung NFS mount stalls the kubelet's volume
manager). kubevol decides from the mount table which mounts are suspect (network and FUSE
types: :func:`is_suspect`) and makes every call on them through a :class:`PathProbe`:

* the call runs on a daemon thread and the caller waits at most the probe's timeout; a
  call that does not answer raises :class:`UnresponsiveError` naming the path and the
  call, and its thread is left to the kernel (it cannot be killed; it ends with the
  process, whose exit kills it);
* while a call on a mount is stuck, further calls on the same mount fail at once, without
  a new thread, and no more than ``max_stuck`` threads are ever left stuck in all.

Nothing is ever decided from a timeout but "this volume did not answer": callers report
it and leave the volume as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from kubevol.errors import KubevolError

_T = TypeVar("_T")

#: Filesystem types whose calls can block on a server or a daemon (mountinfo's field 9;
#: FUSE mounts read ``fuse`` or ``fuse.<subtype>``).
SUSPECT_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "afs",
    "gpfs", "beegfs", "virtiofs", "fuse", "fuseblk",
})

#: How long a call may take before its volume is reported unresponsive (seconds).
DEFAULT_TIMEOUT = 5.0
#: How many threads may be left stuck in the kernel at once, all mounts together.
MAX_STUCK = 32


def is_suspect(fs_type: str) -> bool:
    """Whether calls below a mount of ``fs_type`` may block on a server or a daemon."""
    return fs_type in SUSPECT_FS_TYPES or fs_type.partition(".")[0] in SUSPECT_FS_TYPES


class UnresponsiveError(KubevolError, TimeoutError):
    """A call below a mount point did not answer within its deadline (a dead server or a
    frozen FUSE daemon). ``path`` is what was asked about, ``mount_point`` its mount."""

    def __init__(self, path: str, mount_point: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.mount_point = mount_point


class PathProbe:
    """Runs calls below suspect mount points with a deadline, as the module describes.
    Thread-safe; one per process is enough (the agent and each command keep one)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, *, max_stuck: int = MAX_STUCK) -> None:
        self.timeout = timeout
        self.max_stuck = max_stuck
        self._lock = threading.Lock()
        #: The thread left waiting on each mount point, and on what.
        self._stuck: dict[str, tuple[threading.Thread, str]] = {}

    def stuck(self) -> dict[str, str]:
        """The mount points with a call still stuck, and which call (a call in a lane is
        listed as ``"<lane> <mount point>"``)."""
        with self._lock:
            self._forget_finished()
            return {m: what for m, (_, what) in self._stuck.items()}

    def call(
        self, mount_point: str, path: str, what: str, fn: Callable[[], _T],
        timeout: float | None = None, *, lane: str = "",
    ) -> _T:
        """``fn()`` (a call such as ``stat`` of ``path``, below ``mount_point``), or
        :class:`UnresponsiveError` when it does not answer within ``timeout`` (default: the
        probe's) or an earlier call on the same mount is still stuck. ``fn``'s own
        exceptions are raised as they are.

        Calls in another ``lane`` of the same mount are not held back by a stuck call in
        this one: an unmount (:mod:`kubevol.mount.hungmount`) must be tried while the stat
        that found the mount dead is still stuck."""
        limit = self.timeout if timeout is None else max(0.0, timeout)
        key = f"{lane} {mount_point}" if lane else mount_point
        with self._lock:
            self._forget_finished()
            earlier = self._stuck.get(key)
            if earlier is not None:
                raise UnresponsiveError(path, mount_point, (
                    f"{path}: {what} not tried: an earlier {earlier[1]} below {mount_point} "
                    "has not answered yet"))
            if len(self._stuck) >= self.max_stuck:
                raise UnresponsiveError(path, mount_point, (
                    f"{path}: {what} not tried: {len(self._stuck)} calls on unresponsive "
                    "mounts are still waiting"))
        done = threading.Event()
        outcome: list[_T] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                outcome.append(fn())
            except BaseException as exc:  # handed to the caller
                failure.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=run, name=f"kubevol-probe {mount_point}", daemon=True)
        thread.start()
        if not done.wait(limit):
            with self._lock:
                self._stuck[key] = (thread, what)
            raise UnresponsiveError(path, mount_point, (
                f"{path}: {what} did not answer within {limit:g}s (a dead server or a frozen "
                f"filesystem daemon below {mount_point})"))
        if failure:
            raise failure[0]
        return outcome[0]

    def call_each(
        self, calls: Sequence[tuple[str, str, str, Callable[[], _T]]],
        timeout: float | None = None,
    ) -> list[_T | BaseException]:
        """:meth:`call` of each ``(mount_point, path, what, fn)``, all at once: mounts that
        do not answer cost one deadline together, not one each (a dead server usually
        takes many volumes with it). Each result, or the exception its call raised, in
        order."""
        results: list[_T | BaseException] = [
            UnresponsiveError(c[1], c[0], f"{c[1]}: {c[2]} not tried") for c in calls]

        def one(i: int) -> None:
            mount_point, path, what, fn = calls[i]
            try:
                results[i] = self.call(mount_point, path, what, fn, timeout)
            except BaseException as exc:  # handed to the caller
                results[i] = exc

        waiters = [threading.Thread(target=one, args=(i,), daemon=True)
                   for i in range(len(calls))]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()  # each call returns within its deadline
        return results

    def _forget_finished(self) -> None:
        for mount_point, (thread, _) in list(self._stuck.items()):
            if not thread.is_alive():
                del self._stuck[mount_point]
