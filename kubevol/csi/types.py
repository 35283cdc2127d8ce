"""The CSI data kubevol exchanges with drivers, as attrs types (no protobuf here).

Enum values are the wire values of the spec, so ``AccessMode(1)`` is ``SINGLE_NODE_WRITER``.
Conversion to and from protobuf lives in :mod:`kubevol.csi.convert` only.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar

import attrs

T = TypeVar("T")


def _frozen_map(value: Mapping[str, str] | None) -> Mapping[str, str]:
    """Copy a string map; None means empty."""
    return dict(value or {})


def _to_tuple(value: Iterable[object]) -> tuple[object, ...]:
    """Freeze a sequence argument (attrs converters need a concrete signature for mypy)."""
    return tuple(value)


def _to_frozenset(value: Iterable[object]) -> frozenset[object]:
    """Freeze a set argument."""
    return frozenset(value)


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must not be negative, got {value}")


# --- capabilities -------------------------------------------------------------------


class PluginServiceType(enum.IntEnum):
    """A service the plugin offers (``PluginCapability.Service.Type``)."""

    UNKNOWN = 0
    CONTROLLER_SERVICE = 1
    VOLUME_ACCESSIBILITY_CONSTRAINTS = 2
    GROUP_CONTROLLER_SERVICE = 3
    SNAPSHOT_METADATA_SERVICE = 4


class VolumeExpansionType(enum.IntEnum):
    """How volumes may grow (``PluginCapability.VolumeExpansion.Type``)."""

    UNKNOWN = 0
    ONLINE = 1
    OFFLINE = 2


class ControllerCapability(enum.IntEnum):
    """``ControllerServiceCapability.RPC.Type``."""

    UNKNOWN = 0
    CREATE_DELETE_VOLUME = 1
    PUBLISH_UNPUBLISH_VOLUME = 2
    LIST_VOLUMES = 3
    GET_CAPACITY = 4
    CREATE_DELETE_SNAPSHOT = 5
    LIST_SNAPSHOTS = 6
    CLONE_VOLUME = 7
    PUBLISH_READONLY = 8
    EXPAND_VOLUME = 9
    LIST_VOLUMES_PUBLISHED_NODES = 10
    VOLUME_CONDITION = 11
    GET_VOLUME = 12
    SINGLE_NODE_MULTI_WRITER = 13
    MODIFY_VOLUME = 14
    GET_SNAPSHOT = 15


class NodeCapability(enum.IntEnum):
    """``NodeServiceCapability.RPC.Type``."""

    UNKNOWN = 0
    STAGE_UNSTAGE_VOLUME = 1
    GET_VOLUME_STATS = 2
    EXPAND_VOLUME = 3
    VOLUME_CONDITION = 4
    SINGLE_NODE_MULTI_WRITER = 5
    VOLUME_MOUNT_GROUP = 6


class GroupControllerCapability(enum.IntEnum):
    """``GroupControllerServiceCapability.RPC.Type``."""

    UNKNOWN = 0
    CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT = 1


@attrs.frozen(kw_only=True)
class PluginCapabilities:
    """What ``GetPluginCapabilities`` answered."""

    services: frozenset[PluginServiceType] = attrs.field(
        default=frozenset(), converter=_to_frozenset
    )
    volume_expansion: frozenset[VolumeExpansionType] = attrs.field(
        default=frozenset(), converter=_to_frozenset
    )


@attrs.frozen(kw_only=True)
class PluginInfo:
    """What ``GetPluginInfo`` answered."""

    name: str
    vendor_version: str
    manifest: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)


# --- volume capability --------------------------------------------------------------


class AccessMode(enum.IntEnum):
    """``VolumeCapability.AccessMode.Mode``."""

    UNKNOWN = 0
    SINGLE_NODE_WRITER = 1
    SINGLE_NODE_READER_ONLY = 2
    MULTI_NODE_READER_ONLY = 3
    MULTI_NODE_SINGLE_WRITER = 4
    MULTI_NODE_MULTI_WRITER = 5
    SINGLE_NODE_SINGLE_WRITER = 6
    SINGLE_NODE_MULTI_WRITER = 7


@attrs.frozen(kw_only=True)
class BlockAccess:
    """The volume is used as a raw block device."""


@attrs.frozen(kw_only=True)
class MountAccess:
    """The volume is used as a mounted filesystem."""

    fs_type: str = ""
    mount_flags: tuple[str, ...] = attrs.field(default=(), converter=_to_tuple)
    volume_mount_group: str = ""


@attrs.frozen(kw_only=True)
class VolumeCapability:
    """How a volume will be used: access mode plus block or mount access."""

    access_mode: AccessMode = attrs.field(converter=AccessMode)
    access_type: BlockAccess | MountAccess = attrs.field(factory=MountAccess)

    @classmethod
    def mount(
        cls,
        access_mode: AccessMode = AccessMode.SINGLE_NODE_WRITER,
        fs_type: str = "",
        mount_flags: tuple[str, ...] = (),
    ) -> VolumeCapability:
        """A filesystem capability (the common case)."""
        return cls(
            access_mode=access_mode,
            access_type=MountAccess(fs_type=fs_type, mount_flags=mount_flags),
        )

    @classmethod
    def block(cls, access_mode: AccessMode = AccessMode.SINGLE_NODE_WRITER) -> VolumeCapability:
        """A raw block capability."""
        return cls(access_mode=access_mode, access_type=BlockAccess())


@attrs.frozen(kw_only=True)
class CapacityRange:
    """Size wishes in bytes; 0 means unspecified."""

    required_bytes: int = attrs.field(default=0, validator=_non_negative)
    limit_bytes: int = attrs.field(default=0, validator=_non_negative)


# --- volumes and topology -----------------------------------------------------------


@attrs.frozen(kw_only=True)
class Topology:
    """Topological segments, e.g. ``{"topology.example.com/zone": "z1"}``."""

    segments: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)


@attrs.frozen(kw_only=True)
class TopologyRequirement:
    """Where a new volume must (``requisite``) or should (``preferred``) be accessible."""

    requisite: tuple[Topology, ...] = attrs.field(default=(), converter=_to_tuple)
    preferred: tuple[Topology, ...] = attrs.field(default=(), converter=_to_tuple)


@attrs.frozen(kw_only=True)
class SnapshotSource:
    """Create the volume from this snapshot."""

    snapshot_id: str


@attrs.frozen(kw_only=True)
class VolumeSource:
    """Create the volume as a clone of this volume."""

    volume_id: str


#: What a new volume is pre-populated from.
ContentSource = SnapshotSource | VolumeSource


@attrs.frozen(kw_only=True)
class Volume:
    """A volume as the driver describes it."""

    volume_id: str
    capacity_bytes: int = 0
    volume_context: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)
    content_source: ContentSource | None = None
    accessible_topology: tuple[Topology, ...] = attrs.field(default=(), converter=_to_tuple)


@attrs.frozen(kw_only=True)
class VolumeCondition:
    """Whether the driver sees the volume as abnormal, and why."""

    abnormal: bool = False
    message: str = ""


@attrs.frozen(kw_only=True)
class VolumeStatus:
    """Where a volume is published and its condition (ListVolumes, ControllerGetVolume)."""

    published_node_ids: tuple[str, ...] = attrs.field(default=(), converter=_to_tuple)
    volume_condition: VolumeCondition | None = None


@attrs.frozen(kw_only=True)
class VolumeEntry:
    """A volume with its status."""

    volume: Volume
    status: VolumeStatus | None = None


@attrs.frozen(kw_only=True)
class Page(Generic[T]):
    """One page of a list call; ``next_token`` is empty on the last page."""

    entries: tuple[T, ...] = attrs.field(default=(), converter=_to_tuple)
    next_token: str = ""


@attrs.frozen(kw_only=True)
class Capacity:
    """What ``GetCapacity`` answered; the size bounds are None when the driver did not say."""

    available_capacity: int = 0
    maximum_volume_size: int | None = None
    minimum_volume_size: int | None = None


@attrs.frozen(kw_only=True)
class ConfirmedCapabilities:
    """What ``ValidateVolumeCapabilities`` confirmed."""

    volume_context: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)
    volume_capabilities: tuple[VolumeCapability, ...] = attrs.field(default=(), converter=_to_tuple)
    parameters: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)
    mutable_parameters: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)


@attrs.frozen(kw_only=True)
class ValidationResult:
    """``confirmed`` is None when the driver did not confirm the capabilities."""

    confirmed: ConfirmedCapabilities | None = None
    message: str = ""


@attrs.frozen(kw_only=True)
class ControllerExpansion:
    """What ``ControllerExpandVolume`` answered."""

    capacity_bytes: int = 0
    node_expansion_required: bool = False


# --- snapshots ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Snapshot:
    """A snapshot as the driver describes it."""

    snapshot_id: str
    source_volume_id: str = ""
    size_bytes: int = 0
    creation_time: datetime.datetime | None = None
    ready_to_use: bool = False
    group_snapshot_id: str = ""


@attrs.frozen(kw_only=True)
class VolumeGroupSnapshot:
    """A group snapshot and its member snapshots."""

    group_snapshot_id: str
    snapshots: tuple[Snapshot, ...] = attrs.field(default=(), converter=_to_tuple)
    creation_time: datetime.datetime | None = None
    ready_to_use: bool = False


# --- node ---------------------------------------------------------------------------


class UsageUnit(enum.IntEnum):
    """``VolumeUsage.Unit``."""

    UNKNOWN = 0
    BYTES = 1
    INODES = 2


@attrs.frozen(kw_only=True)
class VolumeUsage:
    """One usage figure of ``NodeGetVolumeStats``."""

    unit: UsageUnit = attrs.field(default=UsageUnit.UNKNOWN, converter=UsageUnit)
    available: int = 0
    total: int = 0
    used: int = 0


@attrs.frozen(kw_only=True)
class VolumeStats:
    """What ``NodeGetVolumeStats`` answered."""

    usage: tuple[VolumeUsage, ...] = attrs.field(default=(), converter=_to_tuple)
    volume_condition: VolumeCondition | None = None

    def by_unit(self, unit: UsageUnit) -> VolumeUsage | None:
        """The usage figure in ``unit``, or None when the driver gave none."""
        return next((u for u in self.usage if u.unit is unit), None)


@attrs.frozen(kw_only=True)
class NodeInfo:
    """What ``NodeGetInfo`` answered; ``max_volumes_per_node`` 0 means no limit."""

    node_id: str
    max_volumes_per_node: int = 0
    accessible_topology: Topology | None = None


# --- snapshot metadata (alpha) ------------------------------------------------------


class BlockMetadataType(enum.IntEnum):
    """How the ranges of a snapshot metadata stream are laid out."""

    UNKNOWN = 0
    FIXED_LENGTH = 1
    VARIABLE_LENGTH = 2


@attrs.frozen(kw_only=True)
class BlockMetadata:
    """One allocated or changed byte range of a block volume snapshot."""

    byte_offset: int
    size_bytes: int


@attrs.frozen(kw_only=True)
class BlockMetadataChunk:
    """One message of a GetMetadataAllocated or GetMetadataDelta stream."""

    block_metadata_type: BlockMetadataType = attrs.field(
        default=BlockMetadataType.UNKNOWN, converter=BlockMetadataType
    )
    volume_capacity_bytes: int = 0
    block_metadata: tuple[BlockMetadata, ...] = attrs.field(default=(), converter=_to_tuple)
