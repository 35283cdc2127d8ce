"""The engine both bundled drivers run on: spec-exact services over a state store and a
storage backend.

The services (:mod:`.controller`, :mod:`.node`, :mod:`.identity`) implement the CSI rules
once -- required fields, idempotency, ALREADY_EXISTS/NOT_FOUND/FAILED_PRECONDITION, paging
with opaque tokens, capacity accounting, capability gating. A driver supplies
:class:`~.settings.DriverSettings`, a :class:`~.backend.VolumeBackend` that does the storage
and node work, and a :class:`~.state.StateStore`; :func:`build_storage_plugin` assembles them.
"""

from __future__ import annotations

from kubevol.csidriver.drivers.engine.backend import Source, VolumeBackend
from kubevol.csidriver.drivers.engine.controller import EngineController
from kubevol.csidriver.drivers.engine.core import Engine
from kubevol.csidriver.drivers.engine.identity import EngineGroupController, EngineIdentity
from kubevol.csidriver.drivers.engine.node import EngineNode
from kubevol.csidriver.drivers.engine.records import (
    AccessKind,
    Attachment,
    GroupSnapshotRecord,
    Publication,
    SnapshotRecord,
    Staging,
    VolumeRecord,
)
from kubevol.csidriver.drivers.engine.settings import DriverSettings
from kubevol.csidriver.drivers.engine.state import (
    DriverState,
    DriverStateError,
    MemoryStore,
    StateStore,
)
from kubevol.csidriver.server import StoragePlugin
from kubevol.util.keyedlocks import KeyedLocks

__all__ = [
    "AccessKind",
    "Attachment",
    "DriverSettings",
    "DriverState",
    "DriverStateError",
    "Engine",
    "EngineController",
    "EngineGroupController",
    "EngineIdentity",
    "EngineNode",
    "GroupSnapshotRecord",
    "KeyedLocks",
    "MemoryStore",
    "Publication",
    "SnapshotRecord",
    "Source",
    "Staging",
    "StateStore",
    "VolumeBackend",
    "VolumeRecord",
    "build_storage_plugin",
]


def build_storage_plugin(engine: Engine, *, max_workers: int = 16) -> StoragePlugin:
    """A :class:`~kubevol.csidriver.server.StoragePlugin` serving ``engine`` (all four services)."""
    controller = EngineController(engine)
    return StoragePlugin(
        identity=EngineIdentity(engine),
        controller=controller,
        node=EngineNode(engine),
        group_controller=EngineGroupController(engine, controller),
        max_workers=max_workers,
    )
