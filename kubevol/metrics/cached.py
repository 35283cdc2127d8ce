"""``CachedMetrics``: measure once, answer from memory afterwards (secret/configMap volumes)."""

from __future__ import annotations

import threading

from kubevol.volume import Metrics, MetricsProvider


class CachedMetrics(MetricsProvider):
    """Wraps ``provider``: its first successful result is returned for good.

    Thread-safe. Concurrent first callers wait for one computation and share its result.
    An error is not cached: it goes to the caller whose computation raised it, and the next
    caller (including one that was waiting) computes again.
    """

    def __init__(self, provider: MetricsProvider) -> None:
        self.provider = provider
        self._lock = threading.Lock()
        self._result: Metrics | None = None

    def __repr__(self) -> str:
        return f"CachedMetrics({self.provider!r})"

    def get_metrics(self) -> Metrics:
        """The cached result, or the wrapped provider's (then cached). Raises what it raises."""
        result = self._result
        if result is not None:
            return result
        with self._lock:
            if self._result is None:
                self._result = self.provider.get_metrics()
            return self._result
