"""The mount interface (Kubernetes' ``mount.Interface``): what plugins use to mount and unmount.

``kubevol.mount.LinuxMounter`` implements it with mount(8)/umount(8) and the kernel's
mount table; ``kubevol.testing.FakeMounter`` records calls for unit tests.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
from collections.abc import Sequence

import attrs

from kubevol.mount.mountread import read_mountinfo_bytes
from kubevol.mount.table import MountTable


@attrs.frozen(kw_only=True)
class MountPoint:
    """One mounted filesystem as ``list()`` reports it."""

    device: str
    path: str
    type: str
    opts: tuple[str, ...] = ()


class MountInterface(abc.ABC):
    """Mounts and unmounts filesystems and answers questions about the mount table.

    Named after mount-utils' ``Interface``, not ``Mounter``: a volume's ``Mounter``
    (:class:`kubevol.volume.Mounter`) is a different thing, the role that sets a volume up.
    """

    @abc.abstractmethod
    def mount(
        self, source: str, target: str, fstype: str = "", options: Sequence[str] = ()
    ) -> None:
        """Mount ``source`` at ``target``. A ``bind`` option with others binds, then remounts
        with them (read-only and other flags only take effect on a remount)."""

    @abc.abstractmethod
    def mount_sensitive(
        self,
        source: str,
        target: str,
        fstype: str,
        options: Sequence[str],
        sensitive_options: Sequence[str],
    ) -> None:
        """Like :meth:`mount`; ``sensitive_options`` are passed on but never logged or raised."""

    @abc.abstractmethod
    def unmount(self, target: str) -> None:
        """Unmount ``target``. Raises :class:`~kubevol.errors.MountError` on failure."""

    @abc.abstractmethod
    def list(self) -> builtins.list[MountPoint]:
        """Every mount in the mount table."""

    @abc.abstractmethod
    def is_likely_not_mount_point(self, path: str) -> bool:
        """Fast check: True when ``path`` is probably not a mount point.

        It can miss bind mounts of a directory of the same filesystem. Raises
        ``FileNotFoundError`` when the path does not exist.
        """

    def is_mount_point(self, path: str) -> bool:
        """Exact check: whether ``path`` is listed as a mount point (after resolving links)."""
        import os

        real = os.path.realpath(path)
        return any(mp.path == real for mp in self.list())

    def table(self, *, superset: bool = False, at: str | None = None) -> MountTable:
        """The node's mount table as it is now: the one snapshot the node layer's checks
        (volume users, unstage verdicts, reconstruction, orphans) read. ``superset`` and
        ``at`` are :meth:`MountTableCache.table <kubevol.mount.table.MountTableCache.table>`'s:
        a caller that only refuses on what it finds may accept a table still listing mounts
        detached since. Raises :class:`~kubevol.errors.MountError` if unreadable.

        Default: this process's mount table, read afresh (a superset is allowed to be
        fresh); :class:`kubevol.mount.LinuxMounter` keeps it until the kernel reports a
        change.
        """
        return MountTable(read_mountinfo_bytes())

    def removing_mount_point(self, path: str) -> contextlib.AbstractContextManager[None]:
        """Around the removal of directory ``path``, where a mount may have been: once it
        is removed, nothing is mounted there, which :meth:`table` may take into account
        (:meth:`MountTableCache.removing <kubevol.mount.table.MountTableCache.removing>`).
        Default: nothing is taken into account."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def get_mount_refs(self, path: str) -> builtins.list[str]:
        """Every other mount point of the filesystem mounted at ``path``, with the same root
        (Kubernetes' ``SearchMountPoints``). Missing or corrupted path: ``[]``."""
