"""Bases a driver author subclasses: one per CSI service.

Each RPC is a method named in snake_case (``NodePublishVolume`` -> ``node_publish_volume``)
that takes the request message and the gRPC context and returns the response message
(``kubevol.csi.convert`` builds them from :mod:`kubevol.csi.types`). What a subclass does not
override answers UNIMPLEMENTED. To fail a call with a given status, raise
:class:`~kubevol.csi.errors.CSIRPCError`; any other exception answers INTERNAL.

The methods run on the server's worker threads, several at a time: implementations must be
thread-safe (the serial-volume middleware only serialises calls per volume).
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterator
from typing import Any, ClassVar

import grpc

from kubevol.csi import pb
from kubevol.csi.errors import CSIRPCError

#: A request or response message, for overrides that handle messages generically (the
#: bases take and return the exact :mod:`kubevol.csi.pb` messages of each RPC).
Message = Any
#: The gRPC servicer context (grpc ships no type stubs).
Context = grpc.ServicerContext


def method_name(rpc_name: str) -> str:
    """The snake_case service method for an RPC: ``NodeGetInfo`` -> ``node_get_info``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", rpc_name).lower()


def _unimplemented(rpc_name: str) -> CSIRPCError:
    return CSIRPCError(grpc.StatusCode.UNIMPLEMENTED, f"{rpc_name} is not implemented")


class CSIService:
    """Common base: ``SERVICE`` is the proto service name the subclass implements."""

    SERVICE: ClassVar[str] = ""


class IdentityService(CSIService, abc.ABC):
    """The Identity service every driver serves. ``get_plugin_info`` is required."""

    SERVICE = "Identity"

    @abc.abstractmethod
    def get_plugin_info(
        self, request: pb.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginInfoResponse:
        """Answer a ``GetPluginInfoResponse`` (name and vendor_version are required)."""

    def get_plugin_capabilities(
        self, request: pb.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginCapabilitiesResponse:
        """No plugin capabilities unless overridden."""
        return pb.GetPluginCapabilitiesResponse()

    def probe(self, request: pb.ProbeRequest, context: grpc.ServicerContext) -> pb.ProbeResponse:
        """Ready unless overridden (an unset ``ready`` means ready)."""
        return pb.ProbeResponse()


class ControllerService(CSIService):
    """The Controller service; override what the driver supports."""

    SERVICE = "Controller"

    def create_volume(
        self, request: pb.CreateVolumeRequest, context: grpc.ServicerContext
    ) -> pb.CreateVolumeResponse:
        """``CreateVolumeRequest`` -> ``CreateVolumeResponse``; idempotent by name."""
        raise _unimplemented("CreateVolume")

    def delete_volume(
        self, request: pb.DeleteVolumeRequest, context: grpc.ServicerContext
    ) -> pb.DeleteVolumeResponse:
        """``DeleteVolumeRequest`` -> ``DeleteVolumeResponse``; OK when already gone."""
        raise _unimplemented("DeleteVolume")

    def controller_publish_volume(
        self, request: pb.ControllerPublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.ControllerPublishVolumeResponse:
        """Attach: ``ControllerPublishVolumeRequest`` -> ``...Response``."""
        raise _unimplemented("ControllerPublishVolume")

    def controller_unpublish_volume(
        self, request: pb.ControllerUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.ControllerUnpublishVolumeResponse:
        """Detach; OK when not attached."""
        raise _unimplemented("ControllerUnpublishVolume")

    def validate_volume_capabilities(
        self, request: pb.ValidateVolumeCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.ValidateVolumeCapabilitiesResponse:
        """Confirm (or not) the requested capabilities."""
        raise _unimplemented("ValidateVolumeCapabilities")

    def list_volumes(
        self, request: pb.ListVolumesRequest, context: grpc.ServicerContext
    ) -> pb.ListVolumesResponse:
        """One page of volumes; a bad starting_token answers ABORTED."""
        raise _unimplemented("ListVolumes")

    def get_capacity(
        self, request: pb.GetCapacityRequest, context: grpc.ServicerContext
    ) -> pb.GetCapacityResponse:
        """Available capacity."""
        raise _unimplemented("GetCapacity")

    def controller_get_capabilities(
        self, request: pb.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.ControllerGetCapabilitiesResponse:
        """Controller capabilities; none unless overridden."""
        return pb.ControllerGetCapabilitiesResponse()

    def create_snapshot(
        self, request: pb.CreateSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.CreateSnapshotResponse:
        """Cut a snapshot; idempotent by name."""
        raise _unimplemented("CreateSnapshot")

    def delete_snapshot(
        self, request: pb.DeleteSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.DeleteSnapshotResponse:
        """Delete a snapshot; OK when already gone."""
        raise _unimplemented("DeleteSnapshot")

    def list_snapshots(
        self, request: pb.ListSnapshotsRequest, context: grpc.ServicerContext
    ) -> pb.ListSnapshotsResponse:
        """One page of snapshots."""
        raise _unimplemented("ListSnapshots")

    def get_snapshot(
        self, request: pb.GetSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.GetSnapshotResponse:
        """One snapshot; NOT_FOUND when unknown."""
        raise _unimplemented("GetSnapshot")

    def controller_expand_volume(
        self, request: pb.ControllerExpandVolumeRequest, context: grpc.ServicerContext
    ) -> pb.ControllerExpandVolumeResponse:
        """Grow a volume on the storage side."""
        raise _unimplemented("ControllerExpandVolume")

    def controller_get_volume(
        self, request: pb.ControllerGetVolumeRequest, context: grpc.ServicerContext
    ) -> pb.ControllerGetVolumeResponse:
        """One volume with its status."""
        raise _unimplemented("ControllerGetVolume")

    def controller_modify_volume(
        self, request: pb.ControllerModifyVolumeRequest, context: grpc.ServicerContext
    ) -> pb.ControllerModifyVolumeResponse:
        """Apply mutable parameters."""
        raise _unimplemented("ControllerModifyVolume")


class GroupControllerService(CSIService):
    """The GroupController service."""

    SERVICE = "GroupController"

    def group_controller_get_capabilities(
        self, request: pb.GroupControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.GroupControllerGetCapabilitiesResponse:
        """Group controller capabilities; none unless overridden."""
        return pb.GroupControllerGetCapabilitiesResponse()

    def create_volume_group_snapshot(
        self, request: pb.CreateVolumeGroupSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.CreateVolumeGroupSnapshotResponse:
        """Snapshot several volumes together; idempotent by name."""
        raise _unimplemented("CreateVolumeGroupSnapshot")

    def delete_volume_group_snapshot(
        self, request: pb.DeleteVolumeGroupSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.DeleteVolumeGroupSnapshotResponse:
        """Delete a group snapshot; OK when already gone."""
        raise _unimplemented("DeleteVolumeGroupSnapshot")

    def get_volume_group_snapshot(
        self, request: pb.GetVolumeGroupSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.GetVolumeGroupSnapshotResponse:
        """One group snapshot."""
        raise _unimplemented("GetVolumeGroupSnapshot")


class SnapshotMetadataService(CSIService):
    """The (alpha) SnapshotMetadata service; both RPCs stream their responses."""

    SERVICE = "SnapshotMetadata"

    def get_metadata_allocated(
        self, request: pb.GetMetadataAllocatedRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GetMetadataAllocatedResponse]:
        """Yield ``GetMetadataAllocatedResponse`` messages."""
        raise _unimplemented("GetMetadataAllocated")

    def get_metadata_delta(
        self, request: pb.GetMetadataDeltaRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GetMetadataDeltaResponse]:
        """Yield ``GetMetadataDeltaResponse`` messages."""
        raise _unimplemented("GetMetadataDelta")


class NodeService(CSIService):
    """The Node service; ``node_get_info`` is needed by every CO."""

    SERVICE = "Node"

    def node_stage_volume(
        self, request: pb.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeStageVolumeResponse:
        """Stage at ``staging_target_path`` (the CO created it); idempotent."""
        raise _unimplemented("NodeStageVolume")

    def node_unstage_volume(
        self, request: pb.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnstageVolumeResponse:
        """Unstage; OK when not staged."""
        raise _unimplemented("NodeUnstageVolume")

    def node_publish_volume(
        self, request: pb.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodePublishVolumeResponse:
        """Publish at ``target_path`` (the driver creates it); idempotent."""
        raise _unimplemented("NodePublishVolume")

    def node_unpublish_volume(
        self, request: pb.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnpublishVolumeResponse:
        """Unpublish and remove ``target_path``; OK when not published."""
        raise _unimplemented("NodeUnpublishVolume")

    def node_get_volume_stats(
        self, request: pb.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetVolumeStatsResponse:
        """Usage of a published volume; NOT_FOUND for an unknown path."""
        raise _unimplemented("NodeGetVolumeStats")

    def node_expand_volume(
        self, request: pb.NodeExpandVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeExpandVolumeResponse:
        """Grow the filesystem on the node."""
        raise _unimplemented("NodeExpandVolume")

    def node_get_capabilities(
        self, request: pb.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetCapabilitiesResponse:
        """Node capabilities; none unless overridden."""
        return pb.NodeGetCapabilitiesResponse()

    def node_get_info(
        self, request: pb.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetInfoResponse:
        """The node id (required, at most 256 bytes), volume limit and topology."""
        raise _unimplemented("NodeGetInfo")
