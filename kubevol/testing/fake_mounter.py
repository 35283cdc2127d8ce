"""An in-memory :class:`~kubevol.mount.MountInterface` that records every call, for unit tests."""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Sequence

import attrs

from kubevol.errors import MountError
from kubevol.mount.interface import MountInterface, MountPoint


@attrs.frozen(kw_only=True)
class FakeAction:
    """One recorded call: ``action`` is ``"mount"`` or ``"unmount"``."""

    action: str
    target: str
    source: str = ""
    fstype: str = ""
    options: tuple[str, ...] = ()


class FakeMounter(MountInterface):
    """Keeps a mount table in memory and records calls in :attr:`log`.

    ``mount`` adds an entry (the options of a bind are recorded as given; sensitive options
    are recorded as ``<masked>``), ``unmount`` removes the last entry at the path and fails
    like umount when there is none. Errors can be injected per target with
    :attr:`mount_errors` / :attr:`unmount_errors`. Paths need not exist, except for
    :meth:`is_likely_not_mount_point`, which raises ``FileNotFoundError`` as the real one
    does. Thread-safe.
    """

    def __init__(self, mount_points: Sequence[MountPoint] = ()) -> None:
        self.mount_points: builtins.list[MountPoint] = list(mount_points)
        self.log: builtins.list[FakeAction] = []
        self.mount_errors: dict[str, BaseException] = {}
        self.unmount_errors: dict[str, BaseException] = {}
        self._lock = threading.Lock()

    def mount(
        self, source: str, target: str, fstype: str = "", options: Sequence[str] = ()
    ) -> None:
        """Record the mount and add it to the table (or raise an injected error)."""
        self.mount_sensitive(source, target, fstype, options, ())

    def mount_sensitive(
        self,
        source: str,
        target: str,
        fstype: str,
        options: Sequence[str],
        sensitive_options: Sequence[str],
    ) -> None:
        """Like :meth:`mount`; sensitive options are recorded only as ``<masked>``."""
        recorded = (*options, *("<masked>" for _ in sensitive_options))
        with self._lock:
            self.log.append(
                FakeAction(
                    action="mount", target=target, source=source, fstype=fstype, options=recorded
                )
            )
            err = self.mount_errors.get(target)
            if err is not None:
                raise err
            device = source
            if "bind" in options:
                # A bind shows the device of what it binds, as in the kernel's table.
                device = next((m.device for m in self.mount_points if m.path == source), source)
            self.mount_points.append(
                MountPoint(device=device, path=target, type=fstype or "none", opts=recorded)
            )

    def unmount(self, target: str) -> None:
        """Remove the last mount at ``target``; MountError when nothing is mounted there."""
        with self._lock:
            self.log.append(FakeAction(action="unmount", target=target))
            err = self.unmount_errors.get(target)
            if err is not None:
                raise err
            for i in range(len(self.mount_points) - 1, -1, -1):
                if self.mount_points[i].path == target:
                    del self.mount_points[i]
                    return
            raise MountError(f"unmount failed: {target}: not mounted")

    def list(self) -> builtins.list[MountPoint]:
        """A copy of the in-memory table."""
        with self._lock:
            return list(self.mount_points)

    def is_mount_point(self, path: str) -> bool:
        """Whether ``path`` is in the table (compared as given, after normalising)."""
        norm = os.path.normpath(path)
        return any(mp.path == norm for mp in self.list())

    def is_likely_not_mount_point(self, path: str) -> bool:
        """Not in the table; raises ``FileNotFoundError`` when ``path`` does not exist."""
        os.stat(path)
        return not self.is_mount_point(path)

    def get_mount_refs(self, path: str) -> builtins.list[str]:
        """Other mount points with the same device as the mount at ``path`` (``[]`` if none)."""
        norm = os.path.normpath(path)
        table = self.list()
        device = next((m.device for m in reversed(table) if m.path == norm), None)
        if device is None:
            return []
        return [m.path for m in table if m.device == device and m.path != norm]

    def actions(self, action: str) -> builtins.list[FakeAction]:
        """The recorded calls of one kind, in order."""
        with self._lock:
            return [a for a in self.log if a.action == action]
