"""The mock CSI driver: every RPC of the spec, exactly as the spec says, in memory.

It differs from gocsi's mock where that one is wrong: paging with an unknown token answers
ABORTED, a same-name volume with other parameters ALREADY_EXISTS, snapshots get real ids,
staging is implemented, NOT_FOUND and OK come where the spec puts them. Capabilities can be
switched off one by one (the RPCs behind them then answer UNIMPLEMENTED).

Node calls touch nothing on the host, unless ``mock_mount`` is set: then publishing creates
the target path (a directory, or a file for block access) and unpublishing removes it,
which is what a conformance suite checks, and needs no privileges.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Mapping
from typing import TypeVar

import attrs

from kubevol.csi import types as t
from kubevol.csi.drivers.common import (
    DEFAULT_NODE_ID,
    RunningDriver,
    kubevol_version,
    serve_plugin,
)
from kubevol.csi.drivers.engine import (
    AccessKind,
    Engine,
    MemoryStore,
    Publication,
    SnapshotRecord,
    Source,
    Staging,
    VolumeBackend,
    VolumeRecord,
    build_storage_plugin,
)
from kubevol.csi.drivers.engine.rpc import Code, fail
from kubevol.csi.drivers.engine.settings import ALL_MODES, DriverSettings, GiB
from kubevol.csi.server import StoragePlugin
from kubevol.lifecycle import ClosesOnExit

DRIVER_NAME = "mock.csi.kubevol.io"

E = TypeVar("E", bound=enum.IntEnum)


def _all(kind: type[E]) -> frozenset[E]:
    return frozenset(c for c in kind if c.value != 0)


def parse_capabilities(kind: type[E], text: str) -> frozenset[E]:
    """Capability names (or numbers) separated by commas; ``none`` is the empty set,
    ``all`` every known one. Raises ``ValueError`` naming an unknown entry."""
    value = text.strip()
    if value.lower() == "none" or not value:
        return frozenset()
    if value.lower() == "all":
        return _all(kind)
    found = set()
    for item in (p.strip() for p in value.split(",")):
        try:
            found.add(kind(int(item)) if item.isdigit() else kind[item.upper()])
        except (KeyError, ValueError):
            names = ", ".join(c.name for c in _all(kind))
            raise ValueError(f"unknown {kind.__name__} {item!r}; known: {names}") from None
    return frozenset(found)


@attrs.frozen(kw_only=True)
class MockConfig:
    """The mock's identity, capabilities and limits; capability sets default to all."""

    node_id: str = DEFAULT_NODE_ID
    driver_name: str = DRIVER_NAME
    version: str = attrs.field(factory=kubevol_version)
    mock_mount: bool = False
    capacity_bytes: int = 1024 * GiB
    max_volume_size: int = 1024 * GiB
    default_volume_size: int = GiB
    attach_limit: int = 0
    plugin_services: frozenset[t.PluginServiceType] = frozenset(
        {t.PluginServiceType.CONTROLLER_SERVICE, t.PluginServiceType.GROUP_CONTROLLER_SERVICE}
    )
    controller_caps: frozenset[t.ControllerCapability] = _all(t.ControllerCapability)
    node_caps: frozenset[t.NodeCapability] = _all(t.NodeCapability)
    group_caps: frozenset[t.GroupControllerCapability] = _all(t.GroupControllerCapability)

    def settings(self) -> DriverSettings:
        """The engine settings for this configuration."""
        return DriverSettings(
            name=self.driver_name,
            version=self.version,
            node_id=self.node_id,
            plugin_services=self.plugin_services,
            controller_caps=self.controller_caps,
            node_caps=self.node_caps,
            group_caps=self.group_caps,
            access_modes=ALL_MODES,
            capacity_bytes=self.capacity_bytes,
            max_volume_size=self.max_volume_size,
            default_volume_size=self.default_volume_size,
            max_volumes_per_node=self.attach_limit,
        )


class MockBackend(VolumeBackend):
    """Storage that exists only in the engine's records; see the module docstring."""

    def __init__(self, mock_mount: bool) -> None:
        self.mock_mount = mock_mount

    def create_volume(self, volume: VolumeRecord, source: Source) -> None:
        """Nothing to store."""

    def delete_volume(self, volume: VolumeRecord) -> None:
        """Nothing to remove."""

    def expand_volume(self, volume: VolumeRecord, new_size: int) -> bool:
        """Block volumes ask the node to expand too, as a real block driver would."""
        return volume.kind is AccessKind.BLOCK

    def create_snapshot(self, snapshot: SnapshotRecord, volume: VolumeRecord) -> None:
        """Nothing to copy."""

    def delete_snapshot(self, snapshot: SnapshotRecord) -> None:
        """Nothing to remove."""

    def volume_condition(self, volume: VolumeRecord) -> t.VolumeCondition:
        """Always healthy."""
        return t.VolumeCondition(abnormal=False, message="mock volume is healthy")

    def stage(self, volume: VolumeRecord, staging: Staging) -> Staging:
        """Only recorded."""
        return staging

    def unstage(self, volume: VolumeRecord, staging: Staging) -> None:
        """Only recorded."""

    def publish(
        self, volume: VolumeRecord, publication: Publication, staging: Staging | None
    ) -> None:
        """With ``mock_mount``: create the target (directory, or file for block)."""
        if not self.mock_mount:
            return
        target = publication.target_path
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if volume.kind is AccessKind.BLOCK:
                with open(target, "a"):
                    pass
            else:
                os.makedirs(target, exist_ok=True)
        except OSError as exc:
            fail(Code.INTERNAL, f"cannot create target {target}: {exc.strerror}")

    def unpublish(self, volume: VolumeRecord, publication: Publication) -> None:
        """With ``mock_mount``: remove the target."""
        if not self.mock_mount:
            return
        target = publication.target_path
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(target) and not os.path.islink(target):
                os.rmdir(target)
            else:
                os.unlink(target)

    def volume_stats(self, volume: VolumeRecord, path: str) -> t.VolumeStats:
        """The volume's capacity, nothing used; abnormal when a mock-mounted path is gone."""
        if self.mock_mount and not os.path.lexists(path) and path in volume.publications:
            return t.VolumeStats(
                volume_condition=t.VolumeCondition(abnormal=True, message=f"{path} is gone")
            )
        usage = t.VolumeUsage(
            unit=t.UsageUnit.BYTES,
            total=volume.capacity_bytes,
            used=0,
            available=volume.capacity_bytes,
        )
        return t.VolumeStats(usage=(usage,), volume_condition=self.volume_condition(volume))

    def node_expand(self, volume: VolumeRecord, path: str) -> int:
        """The recorded capacity."""
        return volume.capacity_bytes


class MockDriver(ClosesOnExit):
    """One mock driver instance: engine (state in memory) and storage plugin."""

    def __init__(self, config: MockConfig | None = None) -> None:
        self.config = config or MockConfig()
        self.engine = Engine(
            self.config.settings(), MockBackend(self.config.mock_mount), MemoryStore()
        )
        self.plugin: StoragePlugin = build_storage_plugin(self.engine)

    def serve(
        self, endpoint: str | None = None, *, env: Mapping[str, str] | None = None
    ) -> RunningDriver:
        """Serve in the background (on a temporary socket when ``endpoint`` is None)."""
        return serve_plugin(self.plugin, endpoint, env=env)

    def close(self) -> None:
        """Nothing to release; for symmetry with the hostpath driver."""
        self.engine.close()


def build_plugin(config: MockConfig | None = None) -> StoragePlugin:
    """The mock's :class:`~kubevol.csi.server.StoragePlugin`."""
    return MockDriver(config).plugin
