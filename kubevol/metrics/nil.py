"""``MetricsNil``: the provider of volumes that cannot be measured (hostPath)."""

from __future__ import annotations

from kubevol.errors import MetricsError
from kubevol.volume import Metrics, MetricsProvider


class MetricsNil(MetricsProvider):
    """Always "not supported". Constructing it and calling it do no I/O."""

    def __repr__(self) -> str:
        return "MetricsNil()"

    def get_metrics(self) -> Metrics:
        """Raise :class:`~kubevol.errors.MetricsError` with code ``NOT_SUPPORTED``."""
        raise MetricsError.not_supported()
