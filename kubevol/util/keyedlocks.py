"""One lock per key, for code that serialises work on a volume, a name or a snapshot.

The node-side volume manager (:mod:`kubevol.nomad`), the in-process lock provider of the
driver framework and the bundled drivers' engine all need the same thing: callers working
on one key run one at a time, callers on other keys are not held up, and a key takes memory
only while someone holds or waits for it (a long-running agent does not grow with every
volume it has ever seen).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: How often a waiter with a cancel event looks at it (seconds).
CANCEL_POLL = 0.05


class _Entry:
    __slots__ = ("held", "lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0  # holder plus waiters
        self.held = False


class KeyedLocks(Generic[K]):
    """Mutual exclusion per key. Thread-safe; not reentrant (like :class:`threading.Lock`)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._entries: dict[K, _Entry] = {}

    def acquire(
        self, key: K, *, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> bool:
        """Take ``key``'s lock; True once held.

        Waits at most ``timeout`` seconds (None: without limit, 0: not at all) and gives up
        as soon as ``cancel`` is set (looked at before the first try, then every
        :data:`CANCEL_POLL` seconds); False when it gave up.
        """
        with self._mutex:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
        got = False
        try:
            got = _wait(entry.lock, timeout, cancel)
        finally:
            with self._mutex:
                if got:
                    entry.held = True
                else:
                    self._leave(key, entry)
        return got

    def release(self, key: K) -> None:
        """Release ``key``'s lock, held by this caller. RuntimeError when it is not held."""
        with self._mutex:
            entry = self._entries.get(key)
            if entry is None or not entry.held:
                raise RuntimeError(f"lock of {key!r} released but not held")
            entry.held = False
            entry.lock.release()
            self._leave(key, entry)

    @contextlib.contextmanager
    def hold(self, *keys: K) -> Iterator[None]:
        """Run the ``with`` body holding the locks of all ``keys``, waiting without limit.

        Several keys are taken in one fixed order (their ``repr``: any order every caller
        shares will do), so two callers wanting overlapping keys cannot deadlock.
        """
        taken: list[K] = []
        try:
            for key in sorted(set(keys), key=repr):
                self.acquire(key)
                taken.append(key)
            yield
        finally:
            for key in reversed(taken):
                self.release(key)

    def held(self) -> int:
        """How many keys are held right now."""
        with self._mutex:
            return sum(1 for entry in self._entries.values() if entry.held)

    def busy(self) -> int:
        """How many keys are held or waited for (each such key takes an entry)."""
        with self._mutex:
            return len(self._entries)

    def _leave(self, key: K, entry: _Entry) -> None:
        """One user less; the entry goes with its last user. Call with the mutex held."""
        entry.users -= 1
        if entry.users == 0:
            del self._entries[key]


def _wait(lock: threading.Lock, timeout: float | None, cancel: threading.Event | None) -> bool:
    if cancel is None:
        return lock.acquire(timeout=-1 if timeout is None else timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not cancel.is_set():
        step = CANCEL_POLL
        if deadline is not None:
            step = min(step, max(0.0, deadline - time.monotonic()))
        if lock.acquire(timeout=step):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
    return False
