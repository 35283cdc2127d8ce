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
  process, whose exit kills it). A thread whose call answered waits for the next call
  (:class:`_Workers`): starting one per call cost more than most calls (a stats refresh
  makes thousands);
* while a call on a mount is stuck, further calls on the same mount fail at once, without
  a new thread, and no more than ``max_stuck`` threads are ever left stuck in all;
* a call that needs no thread to wait on (an RPC whose answer another process computes)
  is started on the caller's thread and waited for with others, under one deadline
  (:meth:`PathProbe.wait_each`): the same rules, without a thread hand-off per call.

Nothing is ever decided from a timeout but "this volume did not answer": callers report
it and leave the volume as it is.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from kubevol.errors import KubevolError

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)

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
#: How many calls :meth:`PathProbe.wait_each` has in flight at once: a node's claims
#: (the agent's stats refresh of 500 pods) all at once, since each wave costs wake-ups and
#: thread hand-offs (32 at a time cost that refresh ~50 ms of CPU more), yet not without
#: bound, for the driver's sake.
IN_FLIGHT = 512


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


class Pending(Protocol[_T_co]):
    """A call that runs without a thread of the caller's (an RPC in flight), as
    :meth:`PathProbe.wait_each` waits for it."""

    def done(self) -> bool:
        """Whether the call ended."""

    def when_done(self, fn: Callable[[], None]) -> None:
        """Have ``fn()`` called once the call ended (at once if it has), on any thread."""

    def outcome(self) -> _T_co:
        """What the ended call returned, or its exception raised."""


class PathProbe:
    """Runs calls below suspect mount points with a deadline, as the module describes.
    Thread-safe; one per process is enough (the agent and each command keep one)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, *, max_stuck: int = MAX_STUCK) -> None:
        self.timeout = timeout
        self.max_stuck = max_stuck
        self._lock = threading.Lock()
        #: The call left waiting on each mount point: whether it ended, and what it is.
        #: A call of :meth:`wait_each` is held here by its ``done`` until it ends: an RPC
        #: whose last reference goes is cancelled, and it must go on as a stuck thread does.
        self._stuck: dict[str, tuple[Callable[[], bool], str]] = {}

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
        return self._finish(self._start(mount_point, path, what, fn, lane),
                            time.monotonic() + limit, limit)

    def call_each(
        self, calls: Sequence[tuple[str, str, str, Callable[[], _T]]],
        timeout: float | None = None,
    ) -> list[_T | BaseException]:
        """:meth:`call` of each ``(mount_point, path, what, fn)``, all at once: mounts that
        do not answer cost one deadline together, not one each (a dead server usually
        takes many volumes with it). Each result, or the exception its call raised, in
        order."""
        limit = self.timeout if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + limit
        started: list[_Call[_T] | BaseException] = []
        for mount_point, path, what, fn in calls:
            try:
                started.append(self._start(mount_point, path, what, fn))
            except UnresponsiveError as exc:
                started.append(exc)
        results: list[_T | BaseException] = []
        for one in started:
            try:
                if isinstance(one, BaseException):
                    raise one
                results.append(self._finish(one, deadline, limit))
            except BaseException as exc:  # handed to the caller
                results.append(exc)
        return results

    def wait_each(
        self, calls: Sequence[tuple[str, str, str, Callable[[], Pending[_T]]]],
        timeout: float | None = None, *, window: int = IN_FLIGHT,
    ) -> list[_T | BaseException]:
        """:meth:`call_each` of calls that need no thread to wait on (an RPC answered by
        another process): each ``(mount_point, path, what, start)`` is started by
        ``start()`` on the calling thread, which must not block, at most ``window`` at a
        time, and waited for without a thread hand-off per call. One that has not ended
        ``timeout`` (default: the probe's) after it started is left stuck on its mount as
        a :meth:`call` is: later calls on the mount fail at once until it ends, and once
        ``max_stuck`` are, every other call does. A driver that stops answering thus costs
        one deadline, not one per call. Each result, or the exception its call raised
        (``start``'s own included), in order."""
        limit = self.timeout if timeout is None else max(0.0, timeout)
        window = max(1, window)
        results: dict[int, _T | BaseException] = {}
        # What started and is waited for, in the order started (so by deadline).
        running: list[tuple[int, float, str, str, str, Pending[_T]]] = []
        endings = _Endings()
        for i, (mount_point, path, what, start) in enumerate(calls):
            try:
                self._admit(mount_point, mount_point, path, what)
                pending = start()
            except BaseException as exc:  # handed to the caller
                results[i] = exc
                continue
            pending.when_done(endings.one_ended)
            running.append((i, time.monotonic() + limit, mount_point, path, what, pending))
            if len(running) >= window:
                running = self._reap(running, results, endings, limit, keep=window // 2)
        while running:
            running = self._reap(running, results, endings, limit, keep=0)
        return [results[i] for i in range(len(calls))]

    def _reap(
        self, running: list[tuple[int, float, str, str, str, Pending[_T]]],
        results: dict[int, _T | BaseException], endings: _Endings, limit: float, *, keep: int,
    ) -> list[tuple[int, float, str, str, str, Pending[_T]]]:
        """Wait until no more than ``keep`` of the ``running`` calls are left (a call is
        left once it ended, or stuck at its deadline): their results in ``results``; the
        calls still running. One wake-up per batch of calls ended, not one per call."""
        while True:
            seen = endings.count()
            now = time.monotonic()
            still = []
            for one in running:
                i, deadline, mount_point, path, what, pending = one
                if pending.done():
                    try:
                        results[i] = pending.outcome()
                    except BaseException as exc:  # handed to the caller
                        results[i] = exc
                elif deadline <= now:
                    with self._lock:
                        self._stuck[mount_point] = (pending.done, what)
                    results[i] = _no_answer(path, mount_point, what, limit)
                else:
                    still.append(one)
            if len(still) <= keep:
                return still
            endings.wait(seen + len(still) - keep, still[0][1])
            running = still

    def _admit(self, key: str, mount_point: str, path: str, what: str) -> None:
        """:class:`UnresponsiveError` when a call on ``key`` (a mount, in a lane) is still
        stuck or too many are."""
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

    def _start(
        self, mount_point: str, path: str, what: str, fn: Callable[[], _T], lane: str = ""
    ) -> _Call[_T]:
        """``fn`` started on a thread of its own, unless a call on the same mount (and lane)
        is still stuck or too many are: then :class:`UnresponsiveError` at once."""
        key = f"{lane} {mount_point}" if lane else mount_point
        self._admit(key, mount_point, path, what)
        return _Call(key, mount_point, path, what, fn)

    def _finish(self, call: _Call[_T], deadline: float, limit: float) -> _T:
        """What ``call`` returned (or raised) by ``deadline``; else it is left stuck and
        :class:`UnresponsiveError` says it did not answer within ``limit``."""
        if not call.wait(deadline):
            with self._lock:
                self._stuck[call.key] = (call.done.is_set, call.what)
            raise _no_answer(call.path, call.mount_point, call.what, limit)
        return call.outcome()

    def _forget_finished(self) -> None:
        for mount_point, (ended, _) in list(self._stuck.items()):
            if ended():
                del self._stuck[mount_point]


def _no_answer(path: str, mount_point: str, what: str, limit: float) -> UnresponsiveError:
    return UnresponsiveError(path, mount_point, (
        f"{path}: {what} did not answer within {limit:g}s (a dead server or "
        f"a frozen filesystem daemon below {mount_point})"))


class _Endings:
    """Counts the calls that ended (:meth:`one_ended`, from any thread) and wakes a waiter
    once as many did as it waits for."""

    def __init__(self) -> None:
        self._ended = 0
        self._target = 0
        self._lock = threading.Lock()
        self._reached = threading.Event()

    def one_ended(self) -> None:
        with self._lock:
            self._ended += 1
            if self._ended >= self._target:
                self._reached.set()

    def count(self) -> int:
        with self._lock:
            return self._ended

    def wait(self, target: int, deadline: float) -> None:
        """Until ``target`` calls in all ended, or ``deadline`` (monotonic) passed."""
        with self._lock:
            if self._ended >= target:
                return
            self._target = target
            self._reached.clear()
        self._reached.wait(max(0.0, deadline - time.monotonic()))


class _Call(Generic[_T]):
    """One call of a :class:`PathProbe`, handed to a worker thread."""

    def __init__(self, key: str, mount_point: str, path: str, what: str,
                 fn: Callable[[], _T]) -> None:
        self.key, self.mount_point, self.path, self.what = key, mount_point, path, what
        #: Set once the call ended.
        self.done = threading.Event()
        self._outcome: list[_T] = []
        self._failure: list[BaseException] = []
        self._fn = fn
        _WORKERS.run(self.run)

    def run(self) -> None:
        """Make the call (on a worker thread)."""
        try:
            self._outcome.append(self._fn())
        except BaseException as exc:  # handed to the caller
            self._failure.append(exc)
        finally:
            self.done.set()

    def wait(self, deadline: float) -> bool:
        """Whether the call ended by ``deadline`` (monotonic)."""
        return self.done.wait(max(0.0, deadline - time.monotonic()))

    def outcome(self) -> _T:
        """What the ended call returned, or its exception raised."""
        if self._failure:
            raise self._failure[0]
        return self._outcome[0]


class _Workers:
    """The daemon threads that make the calls: one whose call ended waits for the next
    (at most ``keep`` wait; more end), one whose call is stuck stays with it."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []

    def run(self, call: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="kubevol-probe",
                             daemon=True).start()
        inbox.put(call)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            call = inbox.get()
            call()
            with self._lock:
                if len(self._idle) >= self.keep:
                    return
                self._idle.append(inbox)


#: The calls' threads, shared by every probe of the process.
_WORKERS = _Workers(keep=16)
