"""Locks that serialise the threads of one process (gocsi's default TryMutex map)."""

from __future__ import annotations

import threading
import time

from kubevol.csi.locks.base import (
    HeldLock,
    LockKind,
    VolumeLockProvider,
    check_lock_key,
    check_timeout,
)


class _InProcessHeldLock(HeldLock):
    def __init__(self, provider: InProcessLockProvider, name: tuple[LockKind, str]) -> None:
        self._provider = provider
        self._name = name
        self._released = False
        self._guard = threading.Lock()

    def release(self) -> None:
        with self._guard:
            if self._released:
                return
            self._released = True
        self._provider._release(self._name)


class InProcessLockProvider(VolumeLockProvider):
    """Exclusive locks shared by the threads of this process only.

    Only held keys take memory: a key's entry goes away when its lock is released, so a
    long-running driver does not grow with the number of volumes it has ever seen.
    """

    def __init__(self) -> None:
        # One condition for every key: waiters re-check their own key when woken. Simple and
        # correct; the extra wake-ups cost little at the call rates CSI drivers see.
        self._cond = threading.Condition()
        self._held: set[tuple[LockKind, str]] = set()

    def acquire(self, kind: LockKind, key: str, timeout: float) -> HeldLock | None:
        """See :meth:`VolumeLockProvider.acquire`; never raises :class:`LockProviderError`."""
        check_lock_key(kind, key)
        deadline = time.monotonic() + check_timeout(timeout)
        name = (kind, key)
        with self._cond:
            while name in self._held:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            self._held.add(name)
        return _InProcessHeldLock(self, name)

    def held_count(self) -> int:
        """How many locks are held right now (for tests and diagnostics)."""
        with self._cond:
            return len(self._held)

    def _release(self, name: tuple[LockKind, str]) -> None:
        with self._cond:
            self._held.discard(name)
            self._cond.notify_all()
