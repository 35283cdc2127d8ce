"""Locks that serialise the threads of one process (gocsi's default TryMutex map)."""

from __future__ import annotations

import threading

from kubevol.csidriver.locks.base import (
    HeldLock,
    LockKind,
    VolumeLockProvider,
    check_lock_key,
    check_timeout,
)
from kubevol.util.keyedlocks import KeyedLocks


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
        self._locks: KeyedLocks[tuple[LockKind, str]] = KeyedLocks()

    def acquire(self, kind: LockKind, key: str, timeout: float) -> HeldLock | None:
        """See :meth:`VolumeLockProvider.acquire`; never raises :class:`LockProviderError`."""
        check_lock_key(kind, key)
        name = (kind, key)
        if not self._locks.acquire(name, timeout=check_timeout(timeout)):
            return None
        return _InProcessHeldLock(self, name)

    def held_count(self) -> int:
        """How many locks are held right now (for tests and diagnostics)."""
        return self._locks.held()

    def _release(self, name: tuple[LockKind, str]) -> None:
        self._locks.release(name)
