"""Time spent inside calls, added up across threads: how benchmarks split a run's wall time
between a CSI driver, gRPC and kubevol."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


class CallClock:
    """Adds up the time spent in the calls it wrapped, from any thread."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._lock = threading.Lock()

    def wrap(self, fn: Callable[_P, _R]) -> Callable[_P, _R]:
        """``fn``, timed into this clock."""

        def timed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds += time.perf_counter() - started
                    self.calls += 1

        return timed
