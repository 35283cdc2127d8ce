"""``MetricsBlock``: the capacity of a raw block volume, and nothing else."""

from __future__ import annotations

import os
import stat

from kubevol.errors import MetricsError, MetricsErrorCode
from kubevol.volume import Metrics, MetricsProvider


class MetricsBlock(MetricsProvider):
    """Reports ``capacity`` of the block device at ``device_path`` (its size in bytes).

    The kubelet measures a block volume by seeking to its end; usage and inodes mean
    nothing for a raw device and stay ``None``. Constructing it does no I/O.
    """

    def __init__(self, device_path: str) -> None:
        self.device_path = device_path

    def __repr__(self) -> str:
        return f"MetricsBlock({self.device_path!r})"

    def get_metrics(self) -> Metrics:
        """Open the device read-only and seek to its end.

        Raises :class:`~kubevol.errors.MetricsError`: ``NO_PATH_DEFINED`` for an empty
        path, ``FS_INFO_FAILED`` if it cannot be opened or is not a block device.
        """
        if not self.device_path:
            raise MetricsError.no_path_defined()
        try:
            fd = os.open(self.device_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise MetricsError.fs_info_failed(self.device_path, exc) from exc
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISBLK(mode):
                raise MetricsError(
                    MetricsErrorCode.FS_INFO_FAILED,
                    f"{self.device_path!r} is not a block device",
                )
            capacity = os.lseek(fd, 0, os.SEEK_END)
        except OSError as exc:
            raise MetricsError.fs_info_failed(self.device_path, exc) from exc
        finally:
            os.close(fd)
        return Metrics(capacity=capacity)
