"""``MetricsDu``: a directory's own usage, with its filesystem's totals (emptyDir's provider)."""

from __future__ import annotations

from kubevol.errors import MetricsError
from kubevol.metrics.quota import project_usage
from kubevol.metrics.statfs import fs_info
from kubevol.metrics.usage import DiskUsage
from kubevol.metrics.walk import walk
from kubevol.volume import Metrics, MetricsProvider


def disk_usage(path: str, *, use_quota: bool = True) -> DiskUsage:
    """What the tree at directory ``path`` occupies (Kubernetes' ``fs.DiskUsage``).

    The project quota answers first, in O(1), when ``path`` carries a project id on a
    filesystem that accounts project quotas (see :mod:`kubevol.metrics.quota`); otherwise
    the tree is walked (see :mod:`kubevol.metrics.walk` for the exact semantics). Raises
    :class:`~kubevol.errors.MetricsError` (``FS_INFO_FAILED``) naming the failing path.
    """
    if use_quota:
        try:
            usage = project_usage(path)
        except OSError as exc:
            raise MetricsError.fs_info_failed(path, exc) from exc
        if usage is not None:
            return usage
    return walk(path)


class MetricsDu(MetricsProvider):
    """Measures the directory ``path``: ``used`` and ``inodes_used`` from :func:`disk_usage`,
    ``capacity``, ``available``, ``inodes`` and ``inodes_free`` from the filesystem holding it.

    Constructing it does no I/O; every :meth:`get_metrics` measures anew (wrap it in
    :class:`~kubevol.metrics.CachedMetrics` to measure once).
    """

    def __init__(self, path: str, *, use_quota: bool = True) -> None:
        self.path = path
        self.use_quota = use_quota

    def __repr__(self) -> str:
        return f"MetricsDu({self.path!r})"

    def get_metrics(self) -> Metrics:
        """Walk (or read the quota of) ``path`` now; may take long on big trees.

        Raises :class:`~kubevol.errors.MetricsError`: ``NO_PATH_DEFINED`` for an empty
        path, ``FS_INFO_FAILED`` if the path is missing, not a directory, or any entry
        below it cannot be read (an entry deleted during the walk is not an error).
        """
        return self.measure()[0]

    def measure(self) -> tuple[Metrics, DiskUsage]:
        """:meth:`get_metrics`, with the :class:`DiskUsage` that says how ``used`` was
        measured (quota or walk, and which walker)."""
        if not self.path:
            raise MetricsError.no_path_defined()
        usage = disk_usage(self.path, use_quota=self.use_quota)
        info = fs_info(self.path)
        metrics = Metrics(
            used=usage.bytes,
            inodes_used=usage.inodes,
            capacity=info.capacity,
            available=info.available,
            inodes=info.inodes,
            inodes_free=info.inodes_free,
        )
        return metrics, usage
