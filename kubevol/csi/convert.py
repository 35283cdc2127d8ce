"""Conversion between :mod:`kubevol.csi.types` and the generated protobuf messages.

The only module that knows both sides. ``*_to_pb`` builds a message, ``*_from_pb`` reads one;
both directions exist for the types a driver or a client sends, so driver authors can reuse
them in :mod:`kubevol.csidriver.server` services.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable
from typing import TypeVar

from kubevol.csi import pb
from kubevol.csi import types as t

#: ListVolumes' entry and ControllerGetVolume's response: one shape, two messages.
_VolumeEntryMessage = pb.ListVolumesResponse.Entry | pb.ControllerGetVolumeResponse
_VolumeStatusMessage = (
    pb.ListVolumesResponse.VolumeStatus | pb.ControllerGetVolumeResponse.VolumeStatus
)


# --- capabilities -------------------------------------------------------------------


def capability_to_pb(cap: t.VolumeCapability) -> pb.VolumeCapability:
    """A :class:`~kubevol.csi.types.VolumeCapability` as ``csi.v1.VolumeCapability``."""
    msg = pb.VolumeCapability(
        access_mode=pb.VolumeCapability.AccessMode(
            mode=pb.VolumeCapability.AccessMode.Mode.ValueType(cap.access_mode)
        )
    )
    if isinstance(cap.access_type, t.BlockAccess):
        msg.block.SetInParent()
    else:
        msg.mount.fs_type = cap.access_type.fs_type
        msg.mount.mount_flags.extend(cap.access_type.mount_flags)
        msg.mount.volume_mount_group = cap.access_type.volume_mount_group
    return msg


def capability_from_pb(msg: pb.VolumeCapability) -> t.VolumeCapability:
    """Read a ``csi.v1.VolumeCapability``; no access type reads as mount access."""
    access: t.BlockAccess | t.MountAccess
    if msg.WhichOneof("access_type") == "block":
        access = t.BlockAccess()
    else:
        access = t.MountAccess(
            fs_type=msg.mount.fs_type,
            mount_flags=tuple(msg.mount.mount_flags),
            volume_mount_group=msg.mount.volume_mount_group,
        )
    return t.VolumeCapability(
        access_mode=_enum(t.AccessMode, msg.access_mode.mode), access_type=access
    )


def capabilities_to_pb(caps: Iterable[t.VolumeCapability]) -> list[pb.VolumeCapability]:
    """Several capabilities, in order."""
    return [capability_to_pb(c) for c in caps]


def capacity_range_to_pb(rng: t.CapacityRange) -> pb.CapacityRange:
    """A :class:`~kubevol.csi.types.CapacityRange` as ``csi.v1.CapacityRange``."""
    return pb.CapacityRange(required_bytes=rng.required_bytes, limit_bytes=rng.limit_bytes)


def capacity_range_from_pb(msg: pb.CapacityRange) -> t.CapacityRange:
    """Read a ``csi.v1.CapacityRange``."""
    return t.CapacityRange(required_bytes=msg.required_bytes, limit_bytes=msg.limit_bytes)


def plugin_info_from_pb(msg: pb.GetPluginInfoResponse) -> t.PluginInfo:
    """Read a ``GetPluginInfoResponse``."""
    return t.PluginInfo(
        name=msg.name, vendor_version=msg.vendor_version, manifest=dict(msg.manifest)
    )


def plugin_info_to_pb(info: t.PluginInfo) -> pb.GetPluginInfoResponse:
    """Build a ``GetPluginInfoResponse``."""
    return pb.GetPluginInfoResponse(
        name=info.name, vendor_version=info.vendor_version, manifest=dict(info.manifest)
    )


def plugin_capabilities_from_pb(msg: pb.GetPluginCapabilitiesResponse) -> t.PluginCapabilities:
    """Read a ``GetPluginCapabilitiesResponse``; unknown values are kept as UNKNOWN."""
    services = set()
    expansion = set()
    for cap in msg.capabilities:
        kind = cap.WhichOneof("type")
        if kind == "service":
            services.add(_enum(t.PluginServiceType, cap.service.type))
        elif kind == "volume_expansion":
            expansion.add(_enum(t.VolumeExpansionType, cap.volume_expansion.type))
    return t.PluginCapabilities(services=services, volume_expansion=expansion)


def plugin_capabilities_to_pb(caps: t.PluginCapabilities) -> pb.GetPluginCapabilitiesResponse:
    """Build a ``GetPluginCapabilitiesResponse`` (services first, sorted)."""
    resp = pb.GetPluginCapabilitiesResponse()
    for svc in sorted(caps.services):
        resp.capabilities.add().service.type = pb.PluginCapability.Service.Type.ValueType(svc)
    for exp in sorted(caps.volume_expansion):
        resp.capabilities.add().volume_expansion.type = (
            pb.PluginCapability.VolumeExpansion.Type.ValueType(exp)
        )
    return resp


def controller_capabilities_from_pb(
    msg: pb.ControllerGetCapabilitiesResponse,
) -> frozenset[t.ControllerCapability]:
    """Read a ``ControllerGetCapabilitiesResponse``."""
    return frozenset(_enum(t.ControllerCapability, c.rpc.type) for c in msg.capabilities)


def controller_capabilities_to_pb(
    caps: Iterable[t.ControllerCapability],
) -> pb.ControllerGetCapabilitiesResponse:
    """Build a ``ControllerGetCapabilitiesResponse``."""
    rpc = pb.ControllerServiceCapability.RPC
    return pb.ControllerGetCapabilitiesResponse(
        capabilities=[
            pb.ControllerServiceCapability(rpc=rpc(type=rpc.Type.ValueType(c)))
            for c in sorted(caps)
        ]
    )


def node_capabilities_from_pb(msg: pb.NodeGetCapabilitiesResponse) -> frozenset[t.NodeCapability]:
    """Read a ``NodeGetCapabilitiesResponse``."""
    return frozenset(_enum(t.NodeCapability, c.rpc.type) for c in msg.capabilities)


def node_capabilities_to_pb(caps: Iterable[t.NodeCapability]) -> pb.NodeGetCapabilitiesResponse:
    """Build a ``NodeGetCapabilitiesResponse``."""
    rpc = pb.NodeServiceCapability.RPC
    return pb.NodeGetCapabilitiesResponse(
        capabilities=[
            pb.NodeServiceCapability(rpc=rpc(type=rpc.Type.ValueType(c))) for c in sorted(caps)
        ]
    )


def group_capabilities_from_pb(
    msg: pb.GroupControllerGetCapabilitiesResponse,
) -> frozenset[t.GroupControllerCapability]:
    """Read a ``GroupControllerGetCapabilitiesResponse``."""
    return frozenset(_enum(t.GroupControllerCapability, c.rpc.type) for c in msg.capabilities)


def group_capabilities_to_pb(
    caps: Iterable[t.GroupControllerCapability],
) -> pb.GroupControllerGetCapabilitiesResponse:
    """Build a ``GroupControllerGetCapabilitiesResponse``."""
    rpc = pb.GroupControllerServiceCapability.RPC
    return pb.GroupControllerGetCapabilitiesResponse(
        capabilities=[
            pb.GroupControllerServiceCapability(rpc=rpc(type=rpc.Type.ValueType(c)))
            for c in sorted(caps)
        ]
    )


# --- topology, volumes --------------------------------------------------------------


def topology_to_pb(topo: t.Topology) -> pb.Topology:
    """A :class:`~kubevol.csi.types.Topology` as ``csi.v1.Topology``."""
    return pb.Topology(segments=dict(topo.segments))


def topology_from_pb(msg: pb.Topology) -> t.Topology:
    """Read a ``csi.v1.Topology``."""
    return t.Topology(segments=dict(msg.segments))


def topology_requirement_to_pb(req: t.TopologyRequirement) -> pb.TopologyRequirement:
    """A :class:`~kubevol.csi.types.TopologyRequirement` as its message."""
    return pb.TopologyRequirement(
        requisite=[topology_to_pb(x) for x in req.requisite],
        preferred=[topology_to_pb(x) for x in req.preferred],
    )


def topology_requirement_from_pb(msg: pb.TopologyRequirement) -> t.TopologyRequirement:
    """Read a ``csi.v1.TopologyRequirement``."""
    return t.TopologyRequirement(
        requisite=[topology_from_pb(x) for x in msg.requisite],
        preferred=[topology_from_pb(x) for x in msg.preferred],
    )


def content_source_to_pb(src: t.ContentSource) -> pb.VolumeContentSource:
    """A snapshot or volume source as ``csi.v1.VolumeContentSource``."""
    msg = pb.VolumeContentSource()
    if isinstance(src, t.SnapshotSource):
        msg.snapshot.snapshot_id = src.snapshot_id
    else:
        msg.volume.volume_id = src.volume_id
    return msg


def content_source_from_pb(msg: pb.VolumeContentSource) -> t.ContentSource | None:
    """Read a ``csi.v1.VolumeContentSource``; None when neither source is set."""
    kind = msg.WhichOneof("type")
    if kind == "snapshot":
        return t.SnapshotSource(snapshot_id=msg.snapshot.snapshot_id)
    if kind == "volume":
        return t.VolumeSource(volume_id=msg.volume.volume_id)
    return None


def volume_to_pb(vol: t.Volume) -> pb.Volume:
    """A :class:`~kubevol.csi.types.Volume` as ``csi.v1.Volume``."""
    msg = pb.Volume(
        volume_id=vol.volume_id,
        capacity_bytes=vol.capacity_bytes,
        volume_context=dict(vol.volume_context),
        accessible_topology=[topology_to_pb(x) for x in vol.accessible_topology],
    )
    if vol.content_source is not None:
        msg.content_source.CopyFrom(content_source_to_pb(vol.content_source))
    return msg


def volume_from_pb(msg: pb.Volume) -> t.Volume:
    """Read a ``csi.v1.Volume``."""
    return t.Volume(
        volume_id=msg.volume_id,
        capacity_bytes=msg.capacity_bytes,
        volume_context=dict(msg.volume_context),
        content_source=(
            content_source_from_pb(msg.content_source) if msg.HasField("content_source") else None
        ),
        accessible_topology=[topology_from_pb(x) for x in msg.accessible_topology],
    )


def volume_condition_from_pb(msg: pb.VolumeCondition) -> t.VolumeCondition:
    """Read a ``csi.v1.VolumeCondition``."""
    return t.VolumeCondition(abnormal=msg.abnormal, message=msg.message)


def volume_status_from_pb(msg: _VolumeStatusMessage) -> t.VolumeStatus:
    """Read a ``VolumeStatus`` of ListVolumes or ControllerGetVolume (same fields)."""
    return t.VolumeStatus(
        published_node_ids=tuple(msg.published_node_ids),
        volume_condition=(
            volume_condition_from_pb(msg.volume_condition)
            if msg.HasField("volume_condition")
            else None
        ),
    )


def volume_entry_from_pb(msg: _VolumeEntryMessage) -> t.VolumeEntry:
    """Read a ListVolumes entry or a ControllerGetVolume response (same shape)."""
    return t.VolumeEntry(
        volume=volume_from_pb(msg.volume),
        status=volume_status_from_pb(msg.status) if msg.HasField("status") else None,
    )


def capacity_from_pb(msg: pb.GetCapacityResponse) -> t.Capacity:
    """Read a ``GetCapacityResponse``; unset size bounds read as None."""
    return t.Capacity(
        available_capacity=msg.available_capacity,
        maximum_volume_size=(
            msg.maximum_volume_size.value if msg.HasField("maximum_volume_size") else None
        ),
        minimum_volume_size=(
            msg.minimum_volume_size.value if msg.HasField("minimum_volume_size") else None
        ),
    )


def validation_from_pb(msg: pb.ValidateVolumeCapabilitiesResponse) -> t.ValidationResult:
    """Read a ``ValidateVolumeCapabilitiesResponse``."""
    confirmed = None
    if msg.HasField("confirmed"):
        c = msg.confirmed
        confirmed = t.ConfirmedCapabilities(
            volume_context=dict(c.volume_context),
            volume_capabilities=[capability_from_pb(x) for x in c.volume_capabilities],
            parameters=dict(c.parameters),
            mutable_parameters=dict(c.mutable_parameters),
        )
    return t.ValidationResult(confirmed=confirmed, message=msg.message)


# --- snapshots ----------------------------------------------------------------------


def _creation_time(msg: pb.Snapshot | pb.VolumeGroupSnapshot) -> datetime.datetime | None:
    """``msg.creation_time`` as an aware UTC datetime; None when unset."""
    if not msg.HasField("creation_time"):
        return None
    return msg.creation_time.ToDatetime(tzinfo=datetime.UTC)


def snapshot_from_pb(msg: pb.Snapshot) -> t.Snapshot:
    """Read a ``csi.v1.Snapshot``; an unset creation time reads as None."""
    return t.Snapshot(
        snapshot_id=msg.snapshot_id,
        source_volume_id=msg.source_volume_id,
        size_bytes=msg.size_bytes,
        creation_time=_creation_time(msg),
        ready_to_use=msg.ready_to_use,
        group_snapshot_id=msg.group_snapshot_id,
    )


def snapshot_to_pb(snap: t.Snapshot) -> pb.Snapshot:
    """A :class:`~kubevol.csi.types.Snapshot` as ``csi.v1.Snapshot``."""
    msg = pb.Snapshot(
        snapshot_id=snap.snapshot_id,
        source_volume_id=snap.source_volume_id,
        size_bytes=snap.size_bytes,
        ready_to_use=snap.ready_to_use,
        group_snapshot_id=snap.group_snapshot_id,
    )
    if snap.creation_time is not None:
        msg.creation_time.FromDatetime(snap.creation_time)
    return msg


def group_snapshot_from_pb(msg: pb.VolumeGroupSnapshot) -> t.VolumeGroupSnapshot:
    """Read a ``csi.v1.VolumeGroupSnapshot``."""
    return t.VolumeGroupSnapshot(
        group_snapshot_id=msg.group_snapshot_id,
        snapshots=[snapshot_from_pb(s) for s in msg.snapshots],
        creation_time=_creation_time(msg),
        ready_to_use=msg.ready_to_use,
    )


# --- node ---------------------------------------------------------------------------


def volume_stats_from_pb(msg: pb.NodeGetVolumeStatsResponse) -> t.VolumeStats:
    """Read a ``NodeGetVolumeStatsResponse``."""
    return t.VolumeStats(
        usage=[
            t.VolumeUsage(
                unit=_enum(t.UsageUnit, u.unit), available=u.available, total=u.total, used=u.used
            )
            for u in msg.usage
        ],
        volume_condition=(
            volume_condition_from_pb(msg.volume_condition)
            if msg.HasField("volume_condition")
            else None
        ),
    )


def volume_stats_to_pb(stats: t.VolumeStats) -> pb.NodeGetVolumeStatsResponse:
    """Build a ``NodeGetVolumeStatsResponse``."""
    msg = pb.NodeGetVolumeStatsResponse(
        usage=[
            pb.VolumeUsage(
                unit=pb.VolumeUsage.Unit.ValueType(u.unit),
                available=u.available,
                total=u.total,
                used=u.used,
            )
            for u in stats.usage
        ]
    )
    if stats.volume_condition is not None:
        msg.volume_condition.abnormal = stats.volume_condition.abnormal
        msg.volume_condition.message = stats.volume_condition.message
    return msg


def node_info_from_pb(msg: pb.NodeGetInfoResponse) -> t.NodeInfo:
    """Read a ``NodeGetInfoResponse``."""
    return t.NodeInfo(
        node_id=msg.node_id,
        max_volumes_per_node=msg.max_volumes_per_node,
        accessible_topology=(
            topology_from_pb(msg.accessible_topology)
            if msg.HasField("accessible_topology")
            else None
        ),
    )


def node_info_to_pb(info: t.NodeInfo) -> pb.NodeGetInfoResponse:
    """Build a ``NodeGetInfoResponse``."""
    msg = pb.NodeGetInfoResponse(
        node_id=info.node_id, max_volumes_per_node=info.max_volumes_per_node
    )
    if info.accessible_topology is not None:
        msg.accessible_topology.CopyFrom(topology_to_pb(info.accessible_topology))
    return msg


def block_metadata_chunk_from_pb(
    msg: pb.GetMetadataAllocatedResponse | pb.GetMetadataDeltaResponse,
) -> t.BlockMetadataChunk:
    """Read a ``GetMetadataAllocatedResponse`` or ``GetMetadataDeltaResponse`` (same shape)."""
    return t.BlockMetadataChunk(
        block_metadata_type=_enum(t.BlockMetadataType, msg.block_metadata_type),
        volume_capacity_bytes=msg.volume_capacity_bytes,
        block_metadata=[
            t.BlockMetadata(byte_offset=b.byte_offset, size_bytes=b.size_bytes)
            for b in msg.block_metadata
        ],
    )


_E = TypeVar("_E", bound=enum.IntEnum)


def _enum(kind: type[_E], value: int) -> _E:
    """``kind(value)``, or ``kind.UNKNOWN`` for a value newer than this kubevol."""
    try:
        return kind(value)
    except ValueError:
        return kind["UNKNOWN"]
