"""The thread pool a driver's gRPC server runs its calls on: a few steady threads, and more
only while calls are kept waiting.

Why not a plain ``ThreadPoolExecutor(max_workers=16)``: with eight clients it runs eight
calls at once, and eight Python threads taking turns at the GIL spend more time handing it
over than working (perf on the hostpath driver: 40% of its CPU time in futex and context
switches; with four threads, 17% less CPU per volume lifecycle and 13-34% more lifecycles
per second in the same runs). Why not four threads and no more: a call that blocks (a copy,
a du, a lock held elsewhere) would then hold up every other call, Probe included. So:
``steady`` threads serve the calls as they come; when the oldest queued call has waited
``patience`` seconds, another thread starts (up to ``max_workers``), and such an extra
thread ends as soon as no call has waited that long.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Generic, Protocol, TypeVar

#: Seconds a call may wait for a steady thread before an extra one starts.
DEFAULT_PATIENCE = 0.05
#: Seconds after which a thread still in one call (stuck on a dead mount, a lock held
#: elsewhere) stops counting as a steady thread: another takes its place, so that later
#: calls do not each wait ``patience`` for an extra thread.
DEFAULT_STUCK_AFTER = 1.0

_T = TypeVar("_T")


class _Queued(Protocol):
    """A call waiting in the queue, whatever it returns."""

    def cancel(self) -> None: ...

    def run(self) -> None: ...


class _Call(Generic[_T]):
    """A submitted call and the future its submitter holds."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], _T]) -> None:
        self.fn = fn
        self.future: futures.Future[_T] = futures.Future()

    def cancel(self) -> None:
        self.future.cancel()

    def run(self) -> None:
        """Run the call unless it was cancelled; its outcome goes to the future."""
        if self.future.set_running_or_notify_cancel():
            try:
                result = self.fn()
            except BaseException as exc:
                self.future.set_exception(exc)
            else:
                self.future.set_result(result)


class ElasticThreadPool(futures.Executor):
    """Runs calls on ``steady`` threads, adding threads up to ``max_workers`` only while
    the oldest waiting call has waited ``patience`` seconds (see the module docstring).
    Threads start on demand; :meth:`shutdown` lets queued calls finish."""

    def __init__(
        self,
        steady: int,
        max_workers: int,
        *,
        patience: float = DEFAULT_PATIENCE,
        stuck_after: float = DEFAULT_STUCK_AFTER,
        thread_name_prefix: str = "pool",
    ) -> None:
        if not 1 <= steady <= max_workers:
            raise ValueError(f"need 1 <= steady ({steady}) <= max_workers ({max_workers})")
        self.steady = steady
        self.max_workers = max_workers
        self.patience = patience
        self.stuck_after = stuck_after
        self._prefix = thread_name_prefix
        #: When each busy worker's current call began, by worker number.
        self._busy_since: dict[int, float] = {}
        #: Of ``_threads``, how many are extra (started for a backlog).
        self._extras = 0
        self._lock = threading.Lock()
        #: Workers wait here for calls; the watcher waits on ``_watch`` for a backlog.
        self._work = threading.Condition(self._lock)
        self._watch = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[float, _Queued]]
        self._queue = collections.deque()
        self._threads = 0
        self._idle = 0
        self._started = 0
        self._watcher: threading.Thread | None = None
        #: The watcher waits without a timeout (nothing queued): a new backlog must wake it.
        self._watcher_parked = False
        self._shutdown = False

    @property
    def threads(self) -> int:
        """Worker threads alive now."""
        with self._lock:
            return self._threads

    def submit(
        self, fn: Callable[..., _T], /, *args: object, **kwargs: object
    ) -> futures.Future[_T]:
        """Queue ``fn(*args, **kwargs)``; RuntimeError after :meth:`shutdown`."""
        call = _Call(lambda: fn(*args, **kwargs))
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._queue.append((time.monotonic(), call))
            if self._idle >= len(self._queue):
                # A woken thread counts as idle until it takes its call: with fewer idle
                # threads than calls queued, this one has no thread coming for it.
                self._work.notify()
            elif self._threads - self._extras - self._stuck() < self.steady:
                self._start_worker(extra=False)
            elif self._threads < self.max_workers:
                self._watch_backlog()
        return call.future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; queued calls still run unless ``cancel_futures``; ``wait``:
        return once every thread has ended."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[1].cancel()
            self._work.notify_all()
            self._watch.notify_all()
        if wait:
            while True:
                with self._lock:
                    if self._threads == 0 and self._watcher is None:
                        return
                time.sleep(0.01)

    # --- under the lock ------------------------------------------------------------

    def _start_worker(self, *, extra: bool) -> None:
        self._threads += 1
        self._extras += extra
        self._started += 1
        name = f"{self._prefix}_{self._started}"
        threading.Thread(target=self._run, args=(extra, self._started), name=name,
                         daemon=True).start()

    def _watch_backlog(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watch_loop, name=f"{self._prefix}_watch", daemon=True
            )
            self._watcher.start()
        elif self._watcher_parked:
            # Otherwise it is already timing the oldest call: waking it on every call
            # would cost a context switch per call when the steady threads are all busy.
            self._watch.notify()

    def _stuck(self) -> int:
        """How many workers have been in one call for :attr:`stuck_after` seconds."""
        now = time.monotonic()
        return sum(1 for since in self._busy_since.values() if now - since >= self.stuck_after)

    def _overdue(self, now: float) -> bool:
        return bool(self._queue) and now - self._queue[0][0] >= self.patience

    # --- threads -------------------------------------------------------------------

    def _run(self, extra: bool, number: int) -> None:
        while True:
            with self._lock:
                self._busy_since.pop(number, None)
                if not extra and self._threads - self._extras - 1 - self._stuck() >= self.steady:
                    # Replaced while it was stuck in its last call: surplus now.
                    self._threads -= 1
                    return
                while True:
                    if extra and not self._overdue(time.monotonic()):
                        # Only here because calls waited: none does now.
                        self._threads -= 1
                        self._extras -= 1
                        return
                    if self._queue:
                        _, call = self._queue.popleft()
                        self._busy_since[number] = time.monotonic()
                        break
                    if self._shutdown:
                        self._threads -= 1
                        self._extras -= extra
                        return
                    self._idle += 1
                    self._work.wait()
                    self._idle -= 1
            call.run()
            del call

    def _watch_loop(self) -> None:
        with self._lock:
            while not (self._shutdown and not self._queue):
                if not self._queue:
                    self._watcher_parked = True
                    self._watch.wait()
                    self._watcher_parked = False
                    continue
                if self._threads >= self.max_workers:
                    self._watch.wait(self.patience)
                    continue
                due = self._queue[0][0] + self.patience - time.monotonic()
                if due <= 0 and not self._idle:
                    self._start_worker(extra=True)
                    self._watch.wait(self.patience)
                else:  # not overdue yet, or an idle worker is about to take it
                    self._watch.wait(max(due, self.patience / 4))
            self._watcher = None
