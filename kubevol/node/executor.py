"""The operation executor: runs volume operations, one at a time per key, with backoff.

This is the kubelet's ``nestedpendingoperations``. Every operation has a key
``(volume, pod, node)``; an empty pod or node is a wildcard that matches any pod or node,
so an operation on the whole volume (``pod=""``) excludes every per-pod operation on it
and the reverse. While an operation on a matching key is running, a new request is refused
with :class:`~kubevol.node.errors.OperationPendingError`. After a failure the key backs off
exponentially (500 ms, doubling, at most 2 min 2 s): the *same* operation asked again
before the wait is over is refused with :class:`~kubevol.node.errors.OperationBackoffError`;
a *different* operation may run at once and resets the backoff. Success forgets the key.

Operations run on worker threads (``workers=0`` runs them inline in the caller, which
tests use for determinism), each in its worker's turn at local work
(:mod:`kubevol.util.turns`): an operation waiting on a driver gives its turn to another. The
executor never interprets an operation's error: retry meaning (transient, uncertain,
final) is for the operation itself to record in the actual state; here every failure
backs off.
"""

from __future__ import annotations

import collections
import concurrent.futures
import enum
import logging
import threading
import time
from collections.abc import Callable

import attrs

from kubevol.node.errors import OperationBackoffError, OperationPendingError
from kubevol.util.backoff import Backoff
from kubevol.util.turns import Turns

log = logging.getLogger(__name__)

#: The wildcard pod or node of a key.
ANY = ""

#: The kubelet's backoff: first wait, and the longest wait (2 min 2 s).
INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 122.0


class OperationKind(enum.StrEnum):
    """What an operation does; the backoff of a key is kept per kind."""

    ATTACH = "attach"
    WAIT_FOR_ATTACH = "wait-for-attach"
    MOUNT_DEVICE = "mount-device"
    SET_UP = "set-up"
    TEAR_DOWN = "tear-down"
    UNMOUNT_DEVICE = "unmount-device"
    DETACH = "detach"
    MAP = "map"
    UNMAP = "unmap"
    UNMAP_DEVICE = "unmap-device"
    EXPAND = "expand"
    #: Not a kubelet storage operation (its housekeeping removes gone pods' directories):
    #: run here so that removals overlap the other operations instead of holding up a pass.
    REMOVE_POD_DIR = "remove-pod-directory"


@attrs.frozen(kw_only=True)
class OperationKey:
    """``(volume, pod, node)``; an empty ``pod`` or ``node`` matches any."""

    volume: str
    pod: str = ANY
    node: str = ANY

    def matches(self, other: OperationKey) -> bool:
        """Whether the two keys conflict under the wildcard rules."""
        return (
            self.volume == other.volume
            and (ANY in (self.pod, other.pod) or self.pod == other.pod)
            and (ANY in (self.node, other.node) or self.node == other.node)
        )

    def __str__(self) -> str:
        return f"(volume={self.volume!r}, pod={self.pod or '*'}, node={self.node or '*'})"


@attrs.define
class _KeyBackoff:
    """Exponential backoff of one key (the kubelet's ``ExponentialBackoff``)."""

    policy: Backoff
    failures: int = 0
    last_error: BaseException | None = None
    last_error_time: float | None = None

    @property
    def duration(self) -> float:
        """How long the key waits after its last failure (0 before any)."""
        return self.policy.delay(self.failures - 1) if self.failures else 0.0

    def update(self, err: BaseException, now: float) -> None:
        self.failures += 1
        self.last_error = err
        self.last_error_time = now

    def retry_in(self, now: float) -> float:
        """Seconds left before a retry is allowed (0 when allowed)."""
        if self.last_error_time is None:
            return 0.0
        return max(0.0, self.last_error_time + self.duration - now)


@attrs.define
class _Record:
    key: OperationKey
    kind: OperationKind
    pending: bool
    backoff: _KeyBackoff


@attrs.frozen(kw_only=True)
class OperationFailure:
    """The last failure of a key that is backing off."""

    key: OperationKey
    kind: OperationKind
    error: BaseException
    retry_in: float


#: Told of every finished operation: its key, kind, duration (seconds) and error (None = ok).
OperationObserver = Callable[[OperationKey, OperationKind, float, BaseException | None], None]


class OperationExecutor:
    """Runs operations under the nested-pending-operations rules. Thread-safe.

    ``workers`` threads run operations (0: inline, in the caller of :meth:`run`);
    ``clock`` is a monotonic clock in seconds (injectable for tests); ``observer`` is told
    of every operation that ends (e.g. to export its duration).
    """

    def __init__(
        self,
        *,
        workers: int = 8,
        clock: Callable[[], float] = time.monotonic,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        observer: OperationObserver | None = None,
    ) -> None:
        self._clock = clock
        self._backoff = Backoff(initial=initial_backoff, maximum=max_backoff)
        self._observer = observer
        self._turns = Turns()
        #: The records by volume, each list in the order its records were made: every key
        #: that matches another names the same volume, so a lookup reads one short list,
        #: not every record (starting n operations is O(n), not O(n²)).
        self._records: dict[str, list[_Record]] = {}
        #: The records whose last operation failed, by identity (what :meth:`failures`
        #: lists: a pass asks every time, while thousands of operations may be pending).
        self._failed: dict[int, _Record] = {}
        #: How many records are pending (what :meth:`wait_idle` waits on).
        self._running = 0
        self._cond = threading.Condition()
        #: How many waiters wait for at most so many pending operations, by that number.
        self._waiting_for: collections.Counter[int] = collections.Counter()
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kubevol-op")
            if workers > 0
            else None
        )

    def run(
        self, key: OperationKey, kind: OperationKind, operation: Callable[[], None]
    ) -> concurrent.futures.Future[None]:
        """Start ``operation`` under ``key``; returns its future.

        Raises :class:`OperationPendingError` when an operation on a matching key is
        running and :class:`OperationBackoffError` when the same kind failed on the key
        and its backoff is not over. Neither starts anything.
        """
        with self._cond:
            record = self._find(key)
            if record is not None:
                if record.pending:
                    raise OperationPendingError(
                        f"an operation ({record.kind}) is already running for {record.key}; "
                        f"{kind} was not started",
                        record.key,
                    )
                wait = record.backoff.retry_in(self._clock())
                if wait > 0 and record.kind == kind:
                    raise OperationBackoffError(
                        f"{kind} for {key} failed; no retries permitted for {wait:.3f} s "
                        f"(backoff {record.backoff.duration:g} s): {record.backoff.last_error}",
                        key,
                        wait,
                        record.backoff.last_error,
                    )
                if record.kind != kind:
                    # Another operation on the key: the old backoff says nothing about it.
                    record.backoff = _KeyBackoff(self._backoff)
                    record.kind = kind
                record.pending = True
                record.key = key
            else:
                record = _Record(
                    key=key, kind=kind, pending=True, backoff=_KeyBackoff(self._backoff)
                )
                self._records.setdefault(key.volume, []).append(record)
            self._running += 1
        if self._pool is None:
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._execute(record, operation, future)
            return future
        future = concurrent.futures.Future()
        self._pool.submit(self._execute, record, operation, future)
        return future

    def _find(self, key: OperationKey) -> _Record | None:
        """The record that conflicts with ``key``: a pending one first, else the exact one,
        else the first matching one (the kubelet's ``isOperationExists``)."""
        found: _Record | None = None
        for record in self._records.get(key.volume, ()):
            if not record.key.matches(key):
                continue
            if record.pending:
                return record
            if found is None or record.key == key:
                found = record
        return found

    def _execute(
        self,
        record: _Record,
        operation: Callable[[], None],
        future: concurrent.futures.Future[None],
    ) -> None:
        error: BaseException | None = None
        started = time.monotonic()
        try:
            with self._turns.take():
                operation()
        except Exception as exc:  # every failure of an operation backs its key off
            error = exc
            log.info("%s for %s failed: %s", record.kind, record.key, exc)
        took = time.monotonic() - started
        with self._cond:
            if error is None:
                same_volume = self._records[record.key.volume]
                same_volume.remove(record)
                if not same_volume:
                    del self._records[record.key.volume]
                self._failed.pop(id(record), None)
            else:
                record.backoff.update(error, self._clock())
                self._failed[id(record)] = record
            record.pending = False
            self._running -= 1
            # Wake the waiters only when one of them may be done: a pass waiting for half
            # of 1,000 operations is not woken (and made to take the GIL) 500 times.
            if self._waiting_for and self._running <= max(self._waiting_for):
                self._cond.notify_all()
        # After the key is free: an observer that starts the next pass (the agent's) finds
        # the volume's next step allowed, not still pending.
        if self._observer is not None:
            try:
                self._observer(record.key, record.kind, took, error)
            except Exception:  # an observer's fault must not change the operation's outcome
                log.exception("operation observer failed")
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def is_pending(self, key: OperationKey) -> bool:
        """Whether an operation on a key matching ``key`` is running."""
        with self._cond:
            record = self._find(key)
            return record is not None and record.pending

    def running(self) -> int:
        """How many operations run now (what :meth:`pending` lists, without listing)."""
        with self._cond:
            return self._running

    def pending(self) -> list[tuple[OperationKey, OperationKind]]:
        """The running operations."""
        with self._cond:
            return [(r.key, r.kind) for r in self._all() if r.pending]

    def failures(self) -> list[OperationFailure]:
        """Keys whose last operation failed, with the error and the wait left."""
        now = self._clock()
        with self._cond:
            return [
                OperationFailure(
                    key=r.key, kind=r.kind, error=r.backoff.last_error,
                    retry_in=r.backoff.retry_in(now),
                )
                for r in self._failed.values()
                if not r.pending and r.backoff.last_error is not None
            ]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no operation runs; False if ``timeout`` seconds passed first."""
        return self._wait_running(lambda _: 0, timeout)

    def wait_progress(self, timeout: float | None = None) -> bool:
        """Block until at most half of the operations running now still run (so at least
        one ended), or none did; False if ``timeout`` seconds passed first.

        For a caller that starts the next steps as earlier ones end (a reconciler pass):
        waiting for every operation leaves the workers idle behind the slowest ones, and
        a pass after each single operation would make the passes cost O(n²).
        """
        return self._wait_running(lambda running: running // 2, timeout)

    def _wait_running(self, most: Callable[[int], int], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = most(self._running)
            self._waiting_for[target] += 1
            try:
                while self._running > target:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._waiting_for[target] -= 1
                if not self._waiting_for[target]:
                    del self._waiting_for[target]
        return True

    def _all(self) -> list[_Record]:
        return [r for same_volume in self._records.values() for r in same_volume]

    def shutdown(self, wait: bool = True, *, timeout: float | None = None) -> list[str]:
        """Stop the workers (after the running operations when ``wait``). Idempotent.

        ``timeout`` bounds the wait: an operation stuck in the kernel below a dead mount
        cannot be stopped, and a thread that never returns cannot be joined. The
        operations still running then are returned (described) and left to end with the
        process."""
        left: list[str] = []
        if wait and timeout is not None and not self.wait_idle(timeout):
            left = [f"{kind} {key}" for key, kind in self.pending()]
            wait = False
        if self._pool is not None:
            self._pool.shutdown(wait=wait)
        return left
