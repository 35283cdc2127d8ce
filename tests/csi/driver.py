"""A small in-memory CSI driver built on kubevol's framework, used by the CSI tests.

It records the metadata and request id of each call, can be told to block a method until
an event is set (to hold a volume lock) or to fail a method with a chosen status, and
creates/removes the target directory as a real node plugin must.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import grpc

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.errors import CSIRPCError
from kubevol.csi.server import (
    ControllerService,
    GroupControllerService,
    IdentityService,
    NodeService,
    SnapshotMetadataService,
    StoragePlugin,
    current_request_id,
)

DRIVER_NAME = "test.csi.kubevol.io"
NODE_ID = "node-1"


class Behaviour:
    """Knobs shared by the services: failures, blocking, what was seen. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fail: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.block: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self.sleep: dict[str, float] = {}
        self.seen_metadata: list[dict[str, str]] = []
        self.seen_request_ids: list[str] = []
        self.calls: list[str] = []
        self.node_caps: set[t.NodeCapability] = {t.NodeCapability.STAGE_UNSTAGE_VOLUME}
        self.node_id = NODE_ID
        self.plugin_name = DRIVER_NAME
        #: When set, entering an RPC creates the file ``<entered_dir>/<RPC>`` (for other processes).
        self.entered_dir: str | None = None

    def enter(self, rpc: str, context: Any) -> None:
        """Record the call, then fail, sleep or block as configured."""
        with self.lock:
            self.calls.append(rpc)
            self.seen_metadata.append(dict(context.invocation_metadata()))
            self.seen_request_ids.append(current_request_id())
            entered = self.entered.get(rpc)
            failure = self.fail.get(rpc)
            gate = self.block.get(rpc)
            pause = self.sleep.get(rpc, 0.0)
        if entered is not None:
            entered.set()
        if self.entered_dir:
            with open(os.path.join(self.entered_dir, rpc), "w"):
                pass
        if failure is not None:
            raise CSIRPCError(*failure)
        if pause:
            time.sleep(pause)
        if gate is not None:
            gate.wait(30)


class Identity(IdentityService):
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour

    def get_plugin_info(self, request: Any, context: Any) -> Any:
        self.b.enter("GetPluginInfo", context)
        return convert.plugin_info_to_pb(
            t.PluginInfo(name=self.b.plugin_name, vendor_version="1.2.3", manifest={"k": "v"})
        )

    def get_plugin_capabilities(self, request: Any, context: Any) -> Any:
        self.b.enter("GetPluginCapabilities", context)
        return convert.plugin_capabilities_to_pb(
            t.PluginCapabilities(
                services={t.PluginServiceType.CONTROLLER_SERVICE},
                volume_expansion={t.VolumeExpansionType.ONLINE},
            )
        )

    def probe(self, request: Any, context: Any) -> Any:
        self.b.enter("Probe", context)
        resp = csi_pb2.ProbeResponse()
        resp.ready.value = True
        return resp


class Controller(ControllerService):
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour
        self.volumes: dict[str, t.Volume] = {}
        self.snapshots: dict[str, t.Snapshot] = {}

    def controller_get_capabilities(self, request: Any, context: Any) -> Any:
        self.b.enter("ControllerGetCapabilities", context)
        return convert.controller_capabilities_to_pb(
            [t.ControllerCapability.CREATE_DELETE_VOLUME, t.ControllerCapability.LIST_VOLUMES]
        )

    def create_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("CreateVolume", context)
        with self.b.lock:
            vol = self.volumes.get(request.name)
            if vol is None:
                vol = t.Volume(
                    volume_id=f"id-{request.name}",
                    capacity_bytes=request.capacity_range.required_bytes,
                    volume_context=dict(request.parameters),
                    content_source=convert.content_source_from_pb(request.volume_content_source)
                    if request.HasField("volume_content_source")
                    else None,
                    accessible_topology=[
                        convert.topology_from_pb(x)
                        for x in request.accessibility_requirements.requisite
                    ],
                )
                self.volumes[request.name] = vol
        return csi_pb2.CreateVolumeResponse(volume=convert.volume_to_pb(vol))

    def delete_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("DeleteVolume", context)
        return csi_pb2.DeleteVolumeResponse()

    def controller_publish_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("ControllerPublishVolume", context)
        return csi_pb2.ControllerPublishVolumeResponse(
            publish_context={"device": "/dev/test", "node": request.node_id}
        )

    def controller_unpublish_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("ControllerUnpublishVolume", context)
        return csi_pb2.ControllerUnpublishVolumeResponse()

    def validate_volume_capabilities(self, request: Any, context: Any) -> Any:
        self.b.enter("ValidateVolumeCapabilities", context)
        resp = csi_pb2.ValidateVolumeCapabilitiesResponse()
        resp.confirmed.volume_capabilities.extend(request.volume_capabilities)
        resp.confirmed.volume_context.update(request.volume_context)
        return resp

    def list_volumes(self, request: Any, context: Any) -> Any:
        self.b.enter("ListVolumes", context)
        with self.b.lock:
            vols = sorted(self.volumes.values(), key=lambda v: v.volume_id)
        resp = csi_pb2.ListVolumesResponse(next_token="more" if vols else "")
        for vol in vols:
            entry = resp.entries.add()
            entry.volume.CopyFrom(convert.volume_to_pb(vol))
            entry.status.published_node_ids.append(NODE_ID)
        return resp

    def get_capacity(self, request: Any, context: Any) -> Any:
        self.b.enter("GetCapacity", context)
        resp = csi_pb2.GetCapacityResponse(available_capacity=1 << 40)
        resp.maximum_volume_size.value = 1 << 30
        return resp

    def create_snapshot(self, request: Any, context: Any) -> Any:
        self.b.enter("CreateSnapshot", context)
        snap = t.Snapshot(
            snapshot_id=f"snap-{request.name}",
            source_volume_id=request.source_volume_id,
            size_bytes=4096,
            creation_time=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
            ready_to_use=True,
        )
        return csi_pb2.CreateSnapshotResponse(snapshot=convert.snapshot_to_pb(snap))

    def controller_expand_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("ControllerExpandVolume", context)
        return csi_pb2.ControllerExpandVolumeResponse(
            capacity_bytes=request.capacity_range.required_bytes, node_expansion_required=True
        )

    def controller_modify_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("ControllerModifyVolume", context)
        return csi_pb2.ControllerModifyVolumeResponse()


class GroupController(GroupControllerService):
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour

    def group_controller_get_capabilities(self, request: Any, context: Any) -> Any:
        self.b.enter("GroupControllerGetCapabilities", context)
        return convert.group_capabilities_to_pb(
            [t.GroupControllerCapability.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT]
        )

    def create_volume_group_snapshot(self, request: Any, context: Any) -> Any:
        self.b.enter("CreateVolumeGroupSnapshot", context)
        resp = csi_pb2.CreateVolumeGroupSnapshotResponse()
        resp.group_snapshot.group_snapshot_id = f"group-{request.name}"
        resp.group_snapshot.ready_to_use = True
        for vol in request.source_volume_ids:
            snap = resp.group_snapshot.snapshots.add()
            snap.snapshot_id = f"snap-{vol}"
            snap.source_volume_id = vol
            snap.group_snapshot_id = f"group-{request.name}"
        return resp


class SnapshotMetadata(SnapshotMetadataService):
    """Streams two fixed-length chunks; an unknown snapshot is NOT_FOUND mid-stream."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour

    def get_metadata_allocated(self, request: Any, context: Any) -> Iterator[Any]:
        self.b.enter("GetMetadataAllocated", context)
        for chunk in range(2):
            resp = csi_pb2.GetMetadataAllocatedResponse(
                block_metadata_type=csi_pb2.FIXED_LENGTH, volume_capacity_bytes=1 << 20
            )
            offset = request.starting_offset + chunk * 8192
            resp.block_metadata.add(byte_offset=offset, size_bytes=4096)
            yield resp
            if request.snapshot_id == "missing":
                raise CSIRPCError(grpc.StatusCode.NOT_FOUND, "snapshot missing vanished")


class Node(NodeService):
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour

    def node_get_capabilities(self, request: Any, context: Any) -> Any:
        self.b.enter("NodeGetCapabilities", context)
        with self.b.lock:
            caps = set(self.b.node_caps)
        return convert.node_capabilities_to_pb(caps)

    def node_get_info(self, request: Any, context: Any) -> Any:
        self.b.enter("NodeGetInfo", context)
        return convert.node_info_to_pb(
            t.NodeInfo(
                node_id=self.b.node_id,
                max_volumes_per_node=7,
                accessible_topology=t.Topology(segments={"zone": "z1"}),
            )
        )

    def node_stage_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("NodeStageVolume", context)
        return csi_pb2.NodeStageVolumeResponse()

    def node_unstage_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("NodeUnstageVolume", context)
        return csi_pb2.NodeUnstageVolumeResponse()

    def node_publish_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("NodePublishVolume", context)
        os.makedirs(request.target_path, exist_ok=True)
        return csi_pb2.NodePublishVolumeResponse()

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("NodeUnpublishVolume", context)
        if os.path.isdir(request.target_path):
            os.rmdir(request.target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    def node_get_volume_stats(self, request: Any, context: Any) -> Any:
        self.b.enter("NodeGetVolumeStats", context)
        if not os.path.exists(request.volume_path):
            raise CSIRPCError(grpc.StatusCode.NOT_FOUND, f"{request.volume_path} not found")
        st = os.statvfs(request.volume_path)
        return convert.volume_stats_to_pb(
            t.VolumeStats(
                usage=[
                    t.VolumeUsage(
                        unit=t.UsageUnit.BYTES,
                        total=st.f_blocks * st.f_frsize,
                        available=st.f_bavail * st.f_frsize,
                        used=(st.f_blocks - st.f_bfree) * st.f_frsize,
                    )
                ],
                volume_condition=t.VolumeCondition(abnormal=False, message="fine"),
            )
        )

    def node_expand_volume(self, request: Any, context: Any) -> Any:
        self.b.enter("NodeExpandVolume", context)
        return csi_pb2.NodeExpandVolumeResponse(
            capacity_bytes=request.capacity_range.required_bytes
        )


def make_plugin(
    behaviour: Behaviour | None = None,
    *,
    env_defaults: Mapping[str, str] | None = None,
    interceptors: tuple[Any, ...] = (),
    before_serve: Any = None,
) -> tuple[StoragePlugin, Behaviour]:
    """The test driver with every service, and its behaviour knobs."""
    b = behaviour or Behaviour()
    plugin = StoragePlugin(
        identity=Identity(b),
        controller=Controller(b),
        node=Node(b),
        group_controller=GroupController(b),
        snapshot_metadata=SnapshotMetadata(b),
        env_defaults=dict(env_defaults or {}),
        interceptors=interceptors,
        before_serve=before_serve,
    )
    return plugin, b
