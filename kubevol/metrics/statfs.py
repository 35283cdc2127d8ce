"""``MetricsStatFS``: a volume's usage from ``statvfs(3)`` of the filesystem it lives on."""

from __future__ import annotations

import os

import attrs

from kubevol.errors import MetricsError
from kubevol.volume import Metrics, MetricsProvider


@attrs.frozen(kw_only=True)
class FsInfo:
    """Filesystem totals from ``statvfs``: bytes and inodes, as ``df`` shows them."""

    capacity: int
    available: int
    used: int
    inodes: int
    inodes_free: int
    inodes_used: int


def fs_info(path: str) -> FsInfo:
    """Read the totals of the filesystem holding ``path``.

    Sizes are in units of ``f_frsize`` (the unit ``df`` uses): ``capacity = blocks * frsize``,
    ``available = bavail * frsize`` (what an unprivileged user may still write),
    ``used = (blocks - bfree) * frsize``; ``inodes_used = files - ffree``. Raises
    :class:`~kubevol.errors.MetricsError` (``FS_INFO_FAILED``) if ``statvfs`` fails.
    """
    try:
        st = os.statvfs(path)
    except OSError as exc:
        raise MetricsError.fs_info_failed(path, exc) from exc
    return FsInfo(
        capacity=st.f_blocks * st.f_frsize,
        available=st.f_bavail * st.f_frsize,
        used=(st.f_blocks - st.f_bfree) * st.f_frsize,
        inodes=st.f_files,
        inodes_free=st.f_ffree,
        inodes_used=st.f_files - st.f_ffree,
    )


class MetricsStatFS(MetricsProvider):
    """Measures the whole filesystem mounted at (or holding) ``path``; cheap, one syscall.

    Kubernetes uses it for volumes that own their filesystem (a CSI or block-backed mount).
    Constructing it does no I/O.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"MetricsStatFS({self.path!r})"

    def get_metrics(self) -> Metrics:
        """Call ``statvfs(path)`` now.

        Raises :class:`~kubevol.errors.MetricsError`: ``NO_PATH_DEFINED`` for an empty
        path, ``FS_INFO_FAILED`` if ``statvfs`` fails.
        """
        if not self.path:
            raise MetricsError.no_path_defined()
        info = fs_info(self.path)
        return Metrics(
            used=info.used,
            capacity=info.capacity,
            available=info.available,
            inodes_used=info.inodes_used,
            inodes=info.inodes,
            inodes_free=info.inodes_free,
        )
