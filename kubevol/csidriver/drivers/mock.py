"""The mock CSI driver: every RPC of the spec, exactly as the spec says, in memory.

It differs from gocsi's mock where that one is wrong: paging with an unknown token answers
ABORTED, a same-name volume with other parameters ALREADY_EXISTS, snapshots get real ids,
staging is implemented, NOT_FOUND and OK come where the spec puts them. Capabilities can be
switched off one by one (the RPCs behind them then answer UNIMPLEMENTED); the ones upstream
csi-sanity does not know (``GET_SNAPSHOT``, the ``SNAPSHOT_METADATA_SERVICE``) are off unless
asked for. Its snapshots hold no data: the SnapshotMetadata service reports a fixed synthetic
layout (:class:`MockSnapshotMetadata`).

Like csi-test's mock, it keeps real paths on the host (``mock_mount``, on by default, no
mounts and no privileges needed): staging needs the CO's staging directory to exist,
publishing creates the target (a directory, or a file for block access) and unpublishing
removes it -- which is what conformance suites check. It refuses a target that exists and
that it did not create, so it never deletes what is not its own. With ``mock_mount`` off,
node calls touch nothing on the host.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator, Mapping
from typing import TypeVar

import attrs

from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.drivers.common import (
    DEFAULT_NODE_ID,
    RunningDriver,
    kubevol_version,
    serve_plugin,
)
from kubevol.csidriver.drivers.engine import (
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
from kubevol.csidriver.drivers.engine.rpc import Code, fail, require
from kubevol.csidriver.drivers.engine.settings import (
    ALL_MODES,
    OPT_IN_CONTROLLER_CAPS,
    DriverSettings,
    GiB,
)
from kubevol.csidriver.server import SnapshotMetadataService, StoragePlugin
from kubevol.csidriver.server.services import Context, Message
from kubevol.util.lifecycle import ClosesOnExit

DRIVER_NAME = "mock.csi.kubevol.io"

#: The block size of the mock's snapshot metadata (``FIXED_LENGTH``).
METADATA_BLOCK_BYTES = 1 << 20
#: Ranges per GetMetadata* response when the request leaves ``max_results`` at 0.
DEFAULT_METADATA_RESULTS = 256

#: The mutable parameters ControllerModifyVolume (and CreateVolume) accept; any other key is
#: INVALID_ARGUMENT, as for a driver whose VolumeAttributesClass knows a fixed set of keys.
MUTABLE_PARAMETER_KEYS = frozenset({"iops", "throughput"})

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
    mock_mount: bool = True
    capacity_bytes: int = 1024 * GiB
    max_volume_size: int = 1024 * GiB
    default_volume_size: int = GiB
    attach_limit: int = 0
    plugin_services: frozenset[t.PluginServiceType] = frozenset(
        {t.PluginServiceType.CONTROLLER_SERVICE, t.PluginServiceType.GROUP_CONTROLLER_SERVICE}
    )
    controller_caps: frozenset[t.ControllerCapability] = (
        _all(t.ControllerCapability) - OPT_IN_CONTROLLER_CAPS
    )
    node_caps: frozenset[t.NodeCapability] = _all(t.NodeCapability)
    group_caps: frozenset[t.GroupControllerCapability] = _all(t.GroupControllerCapability)
    mutable_parameter_keys: frozenset[str] | None = MUTABLE_PARAMETER_KEYS

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
            mutable_parameter_keys=self.mutable_parameter_keys,
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

    def stage(self, volume: VolumeRecord, staging: Staging, *, repeat: bool) -> Staging:
        """Only recorded; with ``mock_mount`` the staging directory must exist (the CO
        creates it)."""
        if self.mock_mount and not os.path.isdir(staging.path):
            fail(
                Code.FAILED_PRECONDITION,
                f"staging path {staging.path} is not a directory (the CO creates it)",
            )
        return staging

    def unstage(self, volume: VolumeRecord, staging: Staging) -> None:
        """Only recorded."""

    def publish(
        self,
        volume: VolumeRecord,
        publication: Publication,
        staging: Staging | None,
        *,
        repeat: bool,
    ) -> None:
        """With ``mock_mount``: create the target (directory, or file for block); a target
        that exists and is not the mock's own is refused."""
        if not self.mock_mount:
            return
        target = publication.target_path
        if os.path.lexists(target):
            if repeat:
                return
            fail(
                Code.FAILED_PRECONDITION,
                f"target {target} exists and was not created by this driver",
            )
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if volume.kind is AccessKind.BLOCK:
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            else:
                os.mkdir(target, 0o750)
        except OSError as exc:
            fail(Code.INTERNAL, f"cannot create target {target}: {exc.strerror}")

    def unpublish(self, volume: VolumeRecord, publication: Publication) -> None:
        """With ``mock_mount``: remove the target (an empty directory or a file; anything
        else found there is left alone and the call fails)."""
        if not self.mock_mount:
            return
        target = publication.target_path
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                os.rmdir(target)
            else:
                os.unlink(target)
        except FileNotFoundError:
            return
        except OSError as exc:
            fail(Code.INTERNAL, f"cannot remove target {target}: {exc.strerror}")

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


class MockSnapshotMetadata(SnapshotMetadataService):
    """The SnapshotMetadata service over the mock's snapshots, which hold no data: it reports
    a fixed layout in whole blocks of :data:`METADATA_BLOCK_BYTES` (``FIXED_LENGTH``) so that
    clients can be exercised. Every other block is allocated (blocks 0, 2, 4, ... of the
    snapshot's size); between two different snapshots of one volume the allocated blocks at
    multiples of 4 changed (none between a snapshot and itself). Errors are the spec's:
    INVALID_ARGUMENT for a missing id, a negative offset or ``max_results``, or snapshots of
    two volumes; NOT_FOUND for an unknown snapshot; OUT_OF_RANGE for a ``starting_offset``
    at or past the volume's size (the offset is rounded down to its block)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _snapshot(self, snapshot_id: str, field: str) -> SnapshotRecord:
        require(snapshot_id, field)
        snap = self.engine.snapshot(snapshot_id)
        if snap is None:
            fail(Code.NOT_FOUND, f"snapshot {snapshot_id} does not exist")
        return snap

    def get_metadata_allocated(self, request: Message, context: Context) -> Iterator[Message]:
        """The allocated blocks of ``snapshot_id``: every other one."""
        snap = self._snapshot(request.snapshot_id, "snapshot_id")
        yield from self._stream(
            csi_pb2.GetMetadataAllocatedResponse, snap.size_bytes, request, step=2
        )

    def get_metadata_delta(self, request: Message, context: Context) -> Iterator[Message]:
        """The blocks that changed from ``base_snapshot_id`` to ``target_snapshot_id``."""
        base = self._snapshot(request.base_snapshot_id, "base_snapshot_id")
        target = self._snapshot(request.target_snapshot_id, "target_snapshot_id")
        if base.source_volume_id != target.source_volume_id:
            fail(
                Code.INVALID_ARGUMENT,
                f"snapshots {base.snapshot_id} and {target.snapshot_id} are of different "
                f"volumes ({base.source_volume_id}, {target.source_volume_id})",
            )
        step = 0 if base.snapshot_id == target.snapshot_id else 4
        yield from self._stream(
            csi_pb2.GetMetadataDeltaResponse, target.size_bytes, request, step=step
        )

    @staticmethod
    def _stream(
        response: type[Message], capacity: int, request: Message, *, step: int
    ) -> Iterator[Message]:
        """Responses listing the whole blocks at multiples of ``step`` (none when 0) from
        the block of ``request.starting_offset``, ``max_results`` at a time; one empty
        response when there are none."""
        if request.starting_offset < 0 or request.max_results < 0:
            fail(Code.INVALID_ARGUMENT, "starting_offset and max_results cannot be negative")
        if request.starting_offset >= capacity:
            fail(
                Code.OUT_OF_RANGE,
                f"starting_offset {request.starting_offset} is not below the volume's size "
                f"({capacity} bytes)",
            )
        per_message = request.max_results or DEFAULT_METADATA_RESULTS
        first = request.starting_offset // METADATA_BLOCK_BYTES
        blocks = capacity // METADATA_BLOCK_BYTES
        offsets = [
            i * METADATA_BLOCK_BYTES for i in range(first, blocks) if step and i % step == 0
        ]
        for start in range(0, max(len(offsets), 1), per_message):
            resp = response(
                block_metadata_type=csi_pb2.FIXED_LENGTH, volume_capacity_bytes=capacity
            )
            for offset in offsets[start : start + per_message]:
                resp.block_metadata.add(byte_offset=offset, size_bytes=METADATA_BLOCK_BYTES)
            yield resp


class MockDriver(ClosesOnExit):
    """One mock driver instance: engine (state in memory) and storage plugin (with the
    SnapshotMetadata service when the configuration advertises it)."""

    def __init__(self, config: MockConfig | None = None) -> None:
        self.config = config or MockConfig()
        self.engine = Engine(
            self.config.settings(), MockBackend(self.config.mock_mount), MemoryStore()
        )
        plugin = build_storage_plugin(self.engine)
        if t.PluginServiceType.SNAPSHOT_METADATA_SERVICE in self.config.plugin_services:
            plugin = attrs.evolve(plugin, snapshot_metadata=MockSnapshotMetadata(self.engine))
        self.plugin: StoragePlugin = plugin

    def serve(
        self, endpoint: str | None = None, *, env: Mapping[str, str] | None = None
    ) -> RunningDriver:
        """Serve in the background (on a temporary socket when ``endpoint`` is None)."""
        return serve_plugin(self.plugin, endpoint, env=env)

    def close(self) -> None:
        """Nothing to release; for symmetry with the hostpath driver."""
        self.engine.close()


def build_plugin(config: MockConfig | None = None) -> StoragePlugin:
    """The mock's :class:`~kubevol.csidriver.server.StoragePlugin`."""
    return MockDriver(config).plugin
