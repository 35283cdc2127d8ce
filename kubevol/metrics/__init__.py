"""Measure volumes the way the kubelet does: providers behind one ``MetricsProvider`` base.

- :class:`MetricsDu` -- a directory's own usage (walk or project quota) plus its
  filesystem's totals; emptyDir's provider.
- :class:`MetricsStatFS` -- a whole filesystem's usage from ``statvfs``.
- :class:`CachedMetrics` -- the first successful result of another provider, kept for good.
- :class:`MetricsBlock` -- a block device's capacity.
- :class:`MetricsNil` -- "not supported" (hostPath).

Every constructor is cheap and does no I/O; measuring happens in ``get_metrics``, which
raises :class:`~kubevol.errors.MetricsError`.
"""

from kubevol.errors import MetricsError, MetricsErrorCode, is_not_supported
from kubevol.metrics.block import MetricsBlock
from kubevol.metrics.cached import CachedMetrics
from kubevol.metrics.du import MetricsDu, disk_usage
from kubevol.metrics.nil import MetricsNil
from kubevol.metrics.statfs import FsInfo, MetricsStatFS, fs_info
from kubevol.metrics.usage import DiskUsage
from kubevol.volume import Metrics, MetricsProvider

__all__ = [
    "CachedMetrics",
    "DiskUsage",
    "FsInfo",
    "Metrics",
    "MetricsBlock",
    "MetricsDu",
    "MetricsError",
    "MetricsErrorCode",
    "MetricsNil",
    "MetricsProvider",
    "MetricsStatFS",
    "disk_usage",
    "fs_info",
    "is_not_supported",
]
