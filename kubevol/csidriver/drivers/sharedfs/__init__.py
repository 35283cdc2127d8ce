"""The sharedfs CSI driver: volumes are sub-directories of a network filesystem that
``mount(8)`` knows (NFS, CephFS, Lustre, GlusterFS, ...), staged the way Azure Lustre's driver
stages them -- one mount of the filesystem per volume at the staging path, the volume's
sub-directory bound at each target. Two volumes staged from one filesystem are two mounts of
one device with root ``/``: the shape behind Kubernetes issue 105323.

Serve it from Python, e.g. for a test::

    config = SharedFSConfig(state_dir="/var/lib/sfs", source="gluster1:/vol", fstype="glusterfs")
    with SharedFSDriver(config).serve() as running:
        client = CSIClient(running.endpoint)

See :mod:`.location` for the parameters and volume contexts it takes, :mod:`.backend` for
what each call does on the filesystem and the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kubevol.csidriver.drivers.common import RunningDriver, serve_plugin
from kubevol.csidriver.drivers.engine import (
    Engine,
    EngineGroupController,
    EngineIdentity,
)
from kubevol.csidriver.drivers.hostpath.state import SqliteStore, StateDirLock
from kubevol.csidriver.drivers.sharedfs.backend import SharedFSBackend
from kubevol.csidriver.drivers.sharedfs.config import DRIVER_NAME, SharedFSConfig
from kubevol.csidriver.drivers.sharedfs.location import (
    Filesystem,
    LocationError,
    OnDelete,
    VolumeLocation,
    location_of,
)
from kubevol.csidriver.drivers.sharedfs.services import SharedFSController, SharedFSNode
from kubevol.csidriver.server import StoragePlugin
from kubevol.util.lifecycle import ClosesOnExit

__all__ = [
    "DRIVER_NAME",
    "Filesystem",
    "LocationError",
    "OnDelete",
    "SharedFSConfig",
    "SharedFSDriver",
    "VolumeLocation",
    "build_plugin",
    "location_of",
]


class SharedFSDriver(ClosesOnExit):
    """One sharedfs driver instance: its state directory (locked while it lives), engine
    and storage plugin. :meth:`close` leaves the volumes' mounts in place (a restarted
    driver takes them over)."""

    def __init__(self, config: SharedFSConfig) -> None:
        self.config = config
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        self._lock = StateDirLock(config.state_dir)
        self._lock.acquire()
        self._store = SqliteStore(config.state_dir)
        try:
            self.backend = SharedFSBackend(config)
            self.engine = Engine(config.settings(), self.backend, self._store)
        except BaseException:
            self._store.close()
            self._lock.release()
            raise
        engine = self.engine
        self.backend.bind_state(engine.volumes, lambda vid: engine.volume(vid) is not None)
        controller = SharedFSController(engine)
        self.plugin: StoragePlugin = StoragePlugin(
            identity=EngineIdentity(engine),
            controller=controller,
            node=SharedFSNode(engine),
            group_controller=EngineGroupController(engine, controller),
        )

    def close(self) -> None:
        """Release the state directory. Idempotent."""
        self.engine.close()
        self._store.close()
        self._lock.release()

    def serve(
        self, endpoint: str | None = None, *, env: Mapping[str, str] | None = None
    ) -> RunningDriver:
        """Serve in the background (on a temporary socket when ``endpoint`` is None);
        stopping the returned driver also closes this one."""
        return serve_plugin(self.plugin, endpoint, env=env, cleanup=self.close)


def build_plugin(config: SharedFSConfig) -> StoragePlugin:
    """The driver's :class:`~kubevol.csidriver.server.StoragePlugin`; the driver holds its
    state directory until the process exits (use :class:`SharedFSDriver` to release it)."""
    return SharedFSDriver(config).plugin
