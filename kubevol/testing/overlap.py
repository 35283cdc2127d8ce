"""How many threads are inside a piece of code at once: for tests of pools and locks."""

from __future__ import annotations

import threading
from types import TracebackType


class Overlap:
    """``with overlap:`` around the code watched; :attr:`peak` is the most threads seen
    inside together, :attr:`entries` how many times it was entered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self.peak = 0
        self.entries = 0

    def __enter__(self) -> None:
        with self._lock:
            self._inside += 1
            self.entries += 1
            self.peak = max(self.peak, self._inside)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            self._inside -= 1
