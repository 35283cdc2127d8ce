"""One operation at a time per volume (Nomad's ``serializedOp``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator

from kubevol.nomad.errors import ManagerShutdownError

#: How often a waiter looks at its cancel event (seconds).
_POLL = 0.05


class _Slot:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class VolumeSerializer:
    """Per-key mutual exclusion whose waiters give up when cancelled. Thread-safe; a
    key's lock exists only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[Hashable, _Slot] = {}

    @contextlib.contextmanager
    def hold(self, key: Hashable, cancel: threading.Event | None = None) -> Iterator[None]:
        """Run the ``with`` body alone for ``key``.

        Raises :class:`~kubevol.nomad.errors.ManagerShutdownError`, without running
        the body, when ``cancel`` is set before the lock is obtained.
        """
        with self._lock:
            slot = self._slots.setdefault(key, _Slot())
            slot.users += 1
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    raise ManagerShutdownError(f"operation on volume {key!r} cancelled")
                if slot.lock.acquire(timeout=_POLL):
                    break
            try:
                yield
            finally:
                slot.lock.release()
        finally:
            with self._lock:
                slot.users -= 1
                if slot.users == 0:
                    del self._slots[key]

    def busy(self) -> int:
        """How many keys are held or waited for."""
        with self._lock:
            return len(self._slots)
