"""The hostpath CSI driver: real volumes on one node, with real mounts.

Volumes are directories (mount access) or loop-backed image files (block access) under a
state directory; staging and publishing are bind mounts; snapshots are copies; the state is
kept in SQLite, one row per record, so a restarted driver still knows its volumes and where
they are staged and published. ``--shared-filesystem IMAGE`` makes every volume a
sub-directory of one ext4 filesystem instead (see :mod:`.shared`).

Serve it from Python, e.g. for a test or a demo::

    with HostPathDriver(HostPathConfig(state_dir="/var/lib/hp")).serve() as running:
        client = CSIClient(running.endpoint)
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kubevol.csidriver.drivers.common import RunningDriver, serve_plugin
from kubevol.csidriver.drivers.engine import Engine, build_storage_plugin
from kubevol.csidriver.drivers.hostpath.backend import HostPathBackend
from kubevol.csidriver.drivers.hostpath.config import DRIVER_NAME, HostPathConfig
from kubevol.csidriver.drivers.hostpath.shared import SharedFilesystemBackend
from kubevol.csidriver.drivers.hostpath.state import SqliteStore, StateDirLock
from kubevol.csidriver.server import StoragePlugin
from kubevol.util.lifecycle import ClosesOnExit

__all__ = [
    "DRIVER_NAME",
    "HostPathConfig",
    "HostPathDriver",
    "build_plugin",
]


class HostPathDriver(ClosesOnExit):
    """One hostpath driver instance: its state directory (locked while it lives), engine
    and storage plugin. :meth:`close` releases the lock and idle loop devices, never the
    volumes' mounts (a restarted driver takes them over)."""

    def __init__(self, config: HostPathConfig) -> None:
        self.config = config
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        self._lock = StateDirLock(config.state_dir)
        self._lock.acquire()
        self._store = SqliteStore(config.state_dir)
        try:
            backend: HostPathBackend
            if config.shared_filesystem:
                backend = SharedFilesystemBackend(
                    config.state_dir, config.shared_filesystem, config.shared_filesystem_size
                )
            else:
                backend = HostPathBackend(config.state_dir)
            self.engine = Engine(config.settings(), backend, self._store)
        except BaseException:
            self._store.close()
            self._lock.release()
            raise
        self.plugin: StoragePlugin = build_storage_plugin(self.engine)

    def close(self) -> None:
        """Release the state directory and idle devices. Idempotent."""
        self.engine.close()
        self._store.close()
        self._lock.release()

    def serve(
        self, endpoint: str | None = None, *, env: Mapping[str, str] | None = None
    ) -> RunningDriver:
        """Serve in the background (on a temporary socket when ``endpoint`` is None); stopping
        the returned driver also closes this one."""
        return serve_plugin(self.plugin, endpoint, env=env, cleanup=self.close)


def build_plugin(config: HostPathConfig) -> StoragePlugin:
    """The driver's :class:`~kubevol.csidriver.server.StoragePlugin`, for
    :func:`~kubevol.csidriver.server.serve` or ``serve_in_background``. The driver holds its
    state directory until the process exits; use :class:`HostPathDriver` to release it."""
    return HostPathDriver(config).plugin
