"""Time spent inside calls, added up across threads: how benchmarks split a run's wall time
between a CSI driver, gRPC and kubevol."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class CallClock:
    """Adds up the time spent in the calls it wrapped, from any thread."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._lock = threading.Lock()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, timed into this clock."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds += time.perf_counter() - started
                    self.calls += 1

        return timed
