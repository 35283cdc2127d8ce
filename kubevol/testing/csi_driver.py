"""A configurable, recording, fault-injecting CSI driver for tests, served in-process over real
gRPC (or as its own process: ``python -m kubevol.testing.csi_driver``).

What it answers is set by plain attributes, changeable while it serves: name, node id,
capabilities, NodeGetInfo's limit and topology, the publish context, the volume condition,
whether Probe says ready. Every call is recorded (:attr:`FakeCSIDriver.records`: the request
as a dict, the gRPC metadata, the request id; optionally also as one JSON line in a log file,
flushed before the answer, for tests that watch another process). Faults: a call can be
failed with a status (forever or the first N times), slowed down, held until an event is set,
and can announce that it was entered.

Node calls do one of two things. Without ``mounts`` they only make and remove the target
directory, as a node plugin must, and need no privileges. With ``mounts`` they do real bind
mounts: a volume is the directory ``volume_context["source"]`` or ``<state_dir>/vols/<id>``;
staging binds it at the staging path, publishing binds the staging path (or the volume) at
the target, read-only through a remount, and a block volume binds the device named in
``volume_context["device"]`` onto a file. ``shared_device`` gives Lustre's shape instead:
staging mounts one ext4 filesystem and publishing binds the volume's sub-directory of it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from kubevol.csi import convert, pb
from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError, StatusCode
from kubevol.csidriver.server import (
    ControllerService,
    GroupControllerService,
    IdentityService,
    NodeService,
    ServerConfig,
    SnapshotMetadataService,
    StoragePlugin,
    current_request_id,
    serve,
)
from kubevol.mount.linux import LinuxMounter

DRIVER_NAME = "test.csi.kubevol.io"
NODE_ID = "node-1"

#: RPCs that only ask (capabilities, identity, node info): :meth:`FakeCSIDriver.names`
#: leaves them out.
QUERIES = frozenset({
    "GetPluginInfo", "GetPluginCapabilities", "Probe",
    "ControllerGetCapabilities", "NodeGetCapabilities", "NodeGetInfo",
    "GroupControllerGetCapabilities",
})

#: A file in a volume that makes its condition abnormal (when the condition is reported).
ABNORMAL_MARKER = ".abnormal"


class CallContext(Protocol):
    """What the driver reads of the gRPC servicer context it is called with."""

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        """The call's metadata as (key, value) pairs."""
        ...


@attrs.define
class Fault:
    """Fail a call with ``code``: forever (``times`` < 0) or the next ``times`` calls."""

    code: StatusCode
    message: str
    times: int = -1


@attrs.frozen(kw_only=True)
class Record:
    """One call as the driver saw it. ``path`` is the path it acts on (target, staging or
    volume path), ``staging`` the staging path a publish names (both ``""`` when none)."""

    rpc: str
    #: The request in protobuf's JSON form (``MessageToDict``): its shape is the RPC's.
    request: dict[str, Any]
    metadata: dict[str, str]
    request_id: str
    path: str
    staging: str
    time: float

    def to_json(self) -> dict[str, object]:
        """The log line's fields."""
        return {"rpc": self.rpc, "pid": os.getpid(), "t": self.time, "path": self.path,
                "staging": self.staging, "request": self.request}


def _default_publish_context(volume_id: str, node_id: str) -> dict[str, str]:
    return {"device": "/dev/test", "node": node_id}


class FakeCSIDriver:
    """State and knobs of the test driver. Thread-safe; build the servable plugin with
    :meth:`plugin`."""

    def __init__(
        self,
        *,
        name: str = DRIVER_NAME,
        node_id: str = NODE_ID,
        state_dir: str | Path | None = None,
        mounts: bool = False,
        shared_device: str = "",
        node_caps: set[t.NodeCapability] | None = None,
        controller_caps: set[t.ControllerCapability] | None = None,
        services: set[t.PluginServiceType] | None = None,
        max_volumes_per_node: int = 7,
        topology: Mapping[str, str] | None = None,
        publish_context: Callable[[str, str], dict[str, str]] = _default_publish_context,
        log_path: str | Path | None = None,
    ) -> None:
        self.lock = threading.Lock()
        # What it answers.
        self.plugin_name = name
        self.vendor_version = "1.2.3"
        self.manifest: dict[str, str] = {"k": "v"}
        self.node_id = node_id
        self.node_caps: set[t.NodeCapability] = (
            {t.NodeCapability.STAGE_UNSTAGE_VOLUME} if node_caps is None else set(node_caps)
        )
        self.controller_caps: set[t.ControllerCapability] = (
            {t.ControllerCapability.CREATE_DELETE_VOLUME, t.ControllerCapability.LIST_VOLUMES}
            if controller_caps is None else set(controller_caps)
        )
        #: None: CONTROLLER_SERVICE exactly when there are controller capabilities.
        self.services = services
        self.max_volumes_per_node = max_volumes_per_node
        self.topology: dict[str, str] = dict({"zone": "z1"} if topology is None else topology)
        self.publish_context = publish_context
        self.ready = True
        self.probe_delay = 0.0
        #: The volume condition NodeGetVolumeStats reports (the marker file overrides it).
        self.condition: t.VolumeCondition | None = t.VolumeCondition(
            abnormal=False, message="fine"
        )
        # How node calls act.
        self.mounts = mounts
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.shared_device = shared_device
        self.mounter = LinuxMounter()
        # Faults.
        self.fail: dict[str, Fault | tuple[StatusCode, str]] = {}
        self.block: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self.sleep: dict[str, float] = {}
        #: When set, entering an RPC creates the file ``<entered_dir>/<RPC>`` (for other
        #: processes).
        self.entered_dir: str | None = None
        # What it saw.
        self.records: list[Record] = []
        self.log_path = str(log_path) if log_path is not None else None
        # Controller state.
        self.volumes: dict[str, t.Volume] = {}
        self.published: dict[str, str] = {}

    # --- building and serving ---------------------------------------------------------

    def plugin(
        self,
        *,
        env_defaults: Mapping[str, str] | None = None,
        interceptors: tuple[object, ...] = (),
        before_serve: Callable[[StoragePlugin, ServerConfig], None] | None = None,
    ) -> StoragePlugin:
        """This driver with every CSI service, ready for :func:`kubevol.csidriver.server.serve`."""
        return StoragePlugin(
            identity=_Identity(self),
            controller=_Controller(self),
            node=_Node(self),
            group_controller=_GroupController(self),
            snapshot_metadata=_SnapshotMetadata(self),
            env_defaults=dict(env_defaults or {}),
            interceptors=interceptors,
            before_serve=before_serve,
        )

    # --- what tests read --------------------------------------------------------------

    @property
    def calls(self) -> list[str]:
        """Every RPC entered, in order."""
        with self.lock:
            return [r.rpc for r in self.records]

    @property
    def seen_metadata(self) -> list[dict[str, str]]:
        """The gRPC metadata of every call, in order."""
        with self.lock:
            return [r.metadata for r in self.records]

    @property
    def seen_request_ids(self) -> list[str]:
        """The request id the server framework gave every call, in order."""
        with self.lock:
            return [r.request_id for r in self.records]

    def requests(self, rpc: str) -> list[dict[str, Any]]:
        """The requests of one RPC, in order, as dicts (fields left at their default are
        absent)."""
        with self.lock:
            return [r.request for r in self.records if r.rpc == rpc]

    def metadata(self, rpc: str) -> list[dict[str, str]]:
        """The gRPC metadata of one RPC's calls, in order."""
        with self.lock:
            return [r.metadata for r in self.records if r.rpc == rpc]

    def names(self) -> list[str]:
        """Every RPC entered, in order, without the :data:`QUERIES`."""
        return [rpc for rpc in self.calls if rpc not in QUERIES]

    def volume_dir(self, volume_id: str) -> Path:
        """The directory backing ``volume_id`` under ``state_dir`` (created on first use)."""
        if self.state_dir is None:
            raise RuntimeError("this FakeCSIDriver has no state_dir")
        path = self.state_dir / "vols" / volume_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def is_mounted(self, path: str) -> bool:
        """Whether ``path`` is a mount point."""
        return os.path.lexists(path) and self.mounter.is_mount_point(path)

    # --- the call path ----------------------------------------------------------------

    def enter(self, rpc: str, request: Message, context: CallContext, *, path: str = "",
              staging: str = "") -> None:
        """Record the call, then fail, sleep or block as configured."""
        record = Record(
            rpc=rpc,
            request=MessageToDict(request, preserving_proto_field_name=True),
            metadata=dict(context.invocation_metadata()),
            request_id=current_request_id(),
            path=path,
            staging=staging,
            time=time.monotonic(),
        )
        with self.lock:
            self.records.append(record)
            if self.log_path is not None:
                with open(self.log_path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(record.to_json()) + "\n")
            entered = self.entered.get(rpc)
            failure = self._take_fault(rpc)
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

    def _take_fault(self, rpc: str) -> tuple[StatusCode, str] | None:
        fault = self.fail.get(rpc)
        if fault is None:
            return None
        if isinstance(fault, tuple):
            return fault
        if fault.times == 0:
            return None
        if fault.times > 0:
            fault.times -= 1
        return fault.code, fault.message

    def volume_source(
        self, request: pb.NodeStageVolumeRequest | pb.NodePublishVolumeRequest
    ) -> str:
        """The directory backing the request's volume."""
        return request.volume_context.get("source") or str(self.volume_dir(request.volume_id))

    def volume_condition(self, volume_path: str) -> t.VolumeCondition | None:
        """The condition of the volume at ``volume_path``."""
        if os.path.exists(os.path.join(volume_path, ABNORMAL_MARKER)):
            return t.VolumeCondition(abnormal=True, message="marker file found")
        return self.condition


class _Identity(IdentityService):
    def __init__(self, d: FakeCSIDriver) -> None:
        self.d = d

    def get_plugin_info(
        self, request: pb.GetPluginInfoRequest, context: CallContext
    ) -> pb.GetPluginInfoResponse:
        self.d.enter("GetPluginInfo", request, context)
        return convert.plugin_info_to_pb(t.PluginInfo(
            name=self.d.plugin_name, vendor_version=self.d.vendor_version,
            manifest=self.d.manifest,
        ))

    def get_plugin_capabilities(
        self, request: pb.GetPluginCapabilitiesRequest, context: CallContext
    ) -> pb.GetPluginCapabilitiesResponse:
        self.d.enter("GetPluginCapabilities", request, context)
        services = self.d.services
        if services is None:
            services = {t.PluginServiceType.CONTROLLER_SERVICE} if self.d.controller_caps else set()
        return convert.plugin_capabilities_to_pb(t.PluginCapabilities(
            services=services, volume_expansion={t.VolumeExpansionType.ONLINE},
        ))

    def probe(self, request: pb.ProbeRequest, context: CallContext) -> pb.ProbeResponse:
        self.d.enter("Probe", request, context)
        if self.d.probe_delay:
            time.sleep(self.d.probe_delay)
        resp = pb.ProbeResponse()
        resp.ready.value = self.d.ready
        return resp


class _Controller(ControllerService):
    """In-memory volumes; publishing records which node a volume is published to."""

    def __init__(self, d: FakeCSIDriver) -> None:
        self.d = d

    def controller_get_capabilities(
        self, request: pb.ControllerGetCapabilitiesRequest, context: CallContext
    ) -> pb.ControllerGetCapabilitiesResponse:
        self.d.enter("ControllerGetCapabilities", request, context)
        return convert.controller_capabilities_to_pb(self.d.controller_caps)

    def create_volume(
        self, request: pb.CreateVolumeRequest, context: CallContext
    ) -> pb.CreateVolumeResponse:
        self.d.enter("CreateVolume", request, context)
        with self.d.lock:
            vol = self.d.volumes.get(request.name)
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
                self.d.volumes[request.name] = vol
        return pb.CreateVolumeResponse(volume=convert.volume_to_pb(vol))

    def delete_volume(
        self, request: pb.DeleteVolumeRequest, context: CallContext
    ) -> pb.DeleteVolumeResponse:
        self.d.enter("DeleteVolume", request, context)
        return pb.DeleteVolumeResponse()

    def controller_publish_volume(
        self, request: pb.ControllerPublishVolumeRequest, context: CallContext
    ) -> pb.ControllerPublishVolumeResponse:
        self.d.enter("ControllerPublishVolume", request, context)
        with self.d.lock:
            self.d.published[request.volume_id] = request.node_id
        return pb.ControllerPublishVolumeResponse(
            publish_context=self.d.publish_context(request.volume_id, request.node_id)
        )

    def controller_unpublish_volume(
        self, request: pb.ControllerUnpublishVolumeRequest, context: CallContext
    ) -> pb.ControllerUnpublishVolumeResponse:
        self.d.enter("ControllerUnpublishVolume", request, context)
        with self.d.lock:
            self.d.published.pop(request.volume_id, None)
        return pb.ControllerUnpublishVolumeResponse()

    def validate_volume_capabilities(
        self, request: pb.ValidateVolumeCapabilitiesRequest, context: CallContext
    ) -> pb.ValidateVolumeCapabilitiesResponse:
        self.d.enter("ValidateVolumeCapabilities", request, context)
        resp = pb.ValidateVolumeCapabilitiesResponse()
        resp.confirmed.volume_capabilities.extend(request.volume_capabilities)
        resp.confirmed.volume_context.update(request.volume_context)
        return resp

    def list_volumes(
        self, request: pb.ListVolumesRequest, context: CallContext
    ) -> pb.ListVolumesResponse:
        self.d.enter("ListVolumes", request, context)
        with self.d.lock:
            vols = sorted(self.d.volumes.values(), key=lambda v: v.volume_id)
        resp = pb.ListVolumesResponse(next_token="more" if vols else "")
        for vol in vols:
            entry = resp.entries.add()
            entry.volume.CopyFrom(convert.volume_to_pb(vol))
            entry.status.published_node_ids.append(self.d.node_id)
        return resp

    def get_capacity(
        self, request: pb.GetCapacityRequest, context: CallContext
    ) -> pb.GetCapacityResponse:
        self.d.enter("GetCapacity", request, context)
        resp = pb.GetCapacityResponse(available_capacity=1 << 40)
        resp.maximum_volume_size.value = 1 << 30
        return resp

    def create_snapshot(
        self, request: pb.CreateSnapshotRequest, context: CallContext
    ) -> pb.CreateSnapshotResponse:
        self.d.enter("CreateSnapshot", request, context)
        snap = t.Snapshot(
            snapshot_id=f"snap-{request.name}",
            source_volume_id=request.source_volume_id,
            size_bytes=4096,
            creation_time=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
            ready_to_use=True,
        )
        return pb.CreateSnapshotResponse(snapshot=convert.snapshot_to_pb(snap))

    def controller_expand_volume(
        self, request: pb.ControllerExpandVolumeRequest, context: CallContext
    ) -> pb.ControllerExpandVolumeResponse:
        self.d.enter("ControllerExpandVolume", request, context)
        return pb.ControllerExpandVolumeResponse(
            capacity_bytes=request.capacity_range.required_bytes, node_expansion_required=True
        )

    def controller_modify_volume(
        self, request: pb.ControllerModifyVolumeRequest, context: CallContext
    ) -> pb.ControllerModifyVolumeResponse:
        self.d.enter("ControllerModifyVolume", request, context)
        return pb.ControllerModifyVolumeResponse()


class _GroupController(GroupControllerService):
    def __init__(self, d: FakeCSIDriver) -> None:
        self.d = d

    def group_controller_get_capabilities(
        self, request: pb.GroupControllerGetCapabilitiesRequest, context: CallContext
    ) -> pb.GroupControllerGetCapabilitiesResponse:
        self.d.enter("GroupControllerGetCapabilities", request, context)
        return convert.group_capabilities_to_pb(
            [t.GroupControllerCapability.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT]
        )

    def create_volume_group_snapshot(
        self, request: pb.CreateVolumeGroupSnapshotRequest, context: CallContext
    ) -> pb.CreateVolumeGroupSnapshotResponse:
        self.d.enter("CreateVolumeGroupSnapshot", request, context)
        resp = pb.CreateVolumeGroupSnapshotResponse()
        resp.group_snapshot.group_snapshot_id = f"group-{request.name}"
        resp.group_snapshot.ready_to_use = True
        for vol in request.source_volume_ids:
            snap = resp.group_snapshot.snapshots.add()
            snap.snapshot_id = f"snap-{vol}"
            snap.source_volume_id = vol
            snap.group_snapshot_id = f"group-{request.name}"
        return resp


class _SnapshotMetadata(SnapshotMetadataService):
    """Streams two fixed-length chunks; the snapshot ``missing`` is NOT_FOUND mid-stream."""

    def __init__(self, d: FakeCSIDriver) -> None:
        self.d = d

    def get_metadata_allocated(
        self, request: pb.GetMetadataAllocatedRequest, context: CallContext
    ) -> Iterator[pb.GetMetadataAllocatedResponse]:
        self.d.enter("GetMetadataAllocated", request, context)
        for chunk in range(2):
            resp = pb.GetMetadataAllocatedResponse(
                block_metadata_type=pb.FIXED_LENGTH, volume_capacity_bytes=1 << 20
            )
            offset = request.starting_offset + chunk * 8192
            resp.block_metadata.add(byte_offset=offset, size_bytes=4096)
            yield resp
            if request.snapshot_id == "missing":
                raise CSIRPCError(StatusCode.NOT_FOUND, "snapshot missing vanished")


class _Node(NodeService):
    def __init__(self, d: FakeCSIDriver) -> None:
        self.d = d

    def node_get_capabilities(
        self, request: pb.NodeGetCapabilitiesRequest, context: CallContext
    ) -> pb.NodeGetCapabilitiesResponse:
        self.d.enter("NodeGetCapabilities", request, context)
        with self.d.lock:
            caps = set(self.d.node_caps)
        return convert.node_capabilities_to_pb(caps)

    def node_get_info(
        self, request: pb.NodeGetInfoRequest, context: CallContext
    ) -> pb.NodeGetInfoResponse:
        self.d.enter("NodeGetInfo", request, context)
        return convert.node_info_to_pb(t.NodeInfo(
            node_id=self.d.node_id,
            max_volumes_per_node=self.d.max_volumes_per_node,
            accessible_topology=t.Topology(segments=self.d.topology),
        ))

    def node_stage_volume(
        self, request: pb.NodeStageVolumeRequest, context: CallContext
    ) -> pb.NodeStageVolumeResponse:
        target = request.staging_target_path
        self.d.enter("NodeStageVolume", request, context, path=target)
        if not self.d.mounts:
            return pb.NodeStageVolumeResponse()
        if not os.path.isdir(target):
            raise CSIRPCError(StatusCode.FAILED_PRECONDITION, f"{target} does not exist")
        if request.volume_capability.WhichOneof("access_type") == "block" or self.d.is_mounted(
            target
        ):
            return pb.NodeStageVolumeResponse()
        if self.d.shared_device:
            self.d.mounter.mount(self.d.shared_device, target, "ext4", [])
            os.makedirs(os.path.join(target, request.volume_id), exist_ok=True)
        else:
            self.d.mounter.mount(self.d.volume_source(request), target, "", ["bind"])
        return pb.NodeStageVolumeResponse()

    def node_unstage_volume(
        self, request: pb.NodeUnstageVolumeRequest, context: CallContext
    ) -> pb.NodeUnstageVolumeResponse:
        target = request.staging_target_path
        self.d.enter("NodeUnstageVolume", request, context, path=target)
        while self.d.mounts and self.d.is_mounted(target):
            self.d.mounter.unmount(target)
        return pb.NodeUnstageVolumeResponse()

    def node_publish_volume(
        self, request: pb.NodePublishVolumeRequest, context: CallContext
    ) -> pb.NodePublishVolumeResponse:
        target = request.target_path
        self.d.enter("NodePublishVolume", request, context, path=target,
                     staging=request.staging_target_path)
        if not self.d.mounts:
            os.makedirs(target, exist_ok=True)
            return pb.NodePublishVolumeResponse()
        if self.d.is_mounted(target):
            return pb.NodePublishVolumeResponse()
        options = ["bind", "ro"] if request.readonly else ["bind"]
        if request.volume_capability.WhichOneof("access_type") == "block":
            device = request.volume_context.get("device", "")
            if not device:
                raise CSIRPCError(StatusCode.INVALID_ARGUMENT, "no device in volume context")
            with open(target, "a"):
                pass
            self.d.mounter.mount(device, target, "", options)
            return pb.NodePublishVolumeResponse()
        source = request.staging_target_path or self.d.volume_source(request)
        if self.d.shared_device and request.staging_target_path:
            source = os.path.join(request.staging_target_path, request.volume_id)
        os.makedirs(target, exist_ok=True)
        self.d.mounter.mount(source, target, "", options)
        return pb.NodePublishVolumeResponse()

    def node_unpublish_volume(
        self, request: pb.NodeUnpublishVolumeRequest, context: CallContext
    ) -> pb.NodeUnpublishVolumeResponse:
        target = request.target_path
        self.d.enter("NodeUnpublishVolume", request, context, path=target)
        while self.d.mounts and self.d.is_mounted(target):
            self.d.mounter.unmount(target)
        if os.path.isdir(target):
            os.rmdir(target)
        elif self.d.mounts and os.path.lexists(target):
            os.unlink(target)
        return pb.NodeUnpublishVolumeResponse()

    def node_get_volume_stats(
        self, request: pb.NodeGetVolumeStatsRequest, context: CallContext
    ) -> pb.NodeGetVolumeStatsResponse:
        path = request.volume_path
        self.d.enter("NodeGetVolumeStats", request, context, path=path)
        if not os.path.exists(path):
            raise CSIRPCError(StatusCode.NOT_FOUND, f"{path} not found")
        st = os.statvfs(path)
        return convert.volume_stats_to_pb(t.VolumeStats(
            usage=[
                t.VolumeUsage(unit=t.UsageUnit.BYTES, total=st.f_blocks * st.f_frsize,
                              available=st.f_bavail * st.f_frsize,
                              used=(st.f_blocks - st.f_bfree) * st.f_frsize),
                t.VolumeUsage(unit=t.UsageUnit.INODES, total=st.f_files,
                              available=st.f_ffree, used=st.f_files - st.f_ffree),
            ],
            volume_condition=self.d.volume_condition(path),
        ))

    def node_expand_volume(
        self, request: pb.NodeExpandVolumeRequest, context: CallContext
    ) -> pb.NodeExpandVolumeResponse:
        self.d.enter("NodeExpandVolume", request, context, path=request.volume_path)
        return pb.NodeExpandVolumeResponse(
            capacity_bytes=request.capacity_range.required_bytes
        )


# --- as its own process ---------------------------------------------------------------


def _fault(text: str) -> tuple[str, Fault]:
    rpc, _, spec = text.partition("=")
    code, _, times = spec.partition(":")
    return rpc, Fault(StatusCode[code], f"{rpc} fails on purpose", int(times) if times else -1)


def main(argv: list[str] | None = None) -> int:
    """Serve the driver until SIGTERM/SIGINT. The endpoint and the server's ``X_CSI_*``
    settings come from the environment unless given; with ``--log`` every call is also
    appended to that file as one JSON line before it is answered."""
    parser = argparse.ArgumentParser(prog="python -m kubevol.testing.csi_driver")
    parser.add_argument("--endpoint", help="unix socket path (default: $CSI_ENDPOINT)")
    parser.add_argument("--name", default=DRIVER_NAME)
    parser.add_argument("--node-id", default=NODE_ID)
    parser.add_argument("--mode", choices=["node", "controller", "both"],
                        help="X_CSI_MODE (default: the environment's)")
    parser.add_argument("--log", help="append each call to this file as a JSON line")
    parser.add_argument("--state-dir", help="mount volumes for real, backed by this directory")
    parser.add_argument("--no-stage", action="store_true", help="no STAGE_UNSTAGE_VOLUME")
    parser.add_argument("--condition", action="store_true",
                        help="report GET_VOLUME_STATS and VOLUME_CONDITION")
    parser.add_argument("--healthy-message", default="volume is fine",
                        help="the condition message of a volume without the marker file")
    parser.add_argument("--not-ready", action="store_true", help="Probe answers not ready")
    parser.add_argument("--probe-delay", type=float, default=0.0)
    parser.add_argument("--fail", action="append", default=[], metavar="RPC=CODE[:TIMES]")
    parser.add_argument("--sleep", action="append", default=[], metavar="RPC=SECONDS")
    parser.add_argument("--entered-dir", help="create <dir>/<RPC> when an RPC is entered")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)

    node_caps = set() if args.no_stage else {t.NodeCapability.STAGE_UNSTAGE_VOLUME}
    if args.condition:
        node_caps |= {t.NodeCapability.GET_VOLUME_STATS, t.NodeCapability.VOLUME_CONDITION}
    services = {t.PluginServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS}
    if args.mode in ("controller", "both"):
        services.add(t.PluginServiceType.CONTROLLER_SERVICE)
    driver = FakeCSIDriver(
        name=args.name,
        node_id=args.node_id,
        state_dir=args.state_dir,
        mounts=args.state_dir is not None,
        node_caps=node_caps,
        controller_caps={t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME,
                         t.ControllerCapability.LIST_VOLUMES},
        services=services if args.mode else None,
        log_path=args.log,
    )
    driver.ready = not args.not_ready
    driver.probe_delay = args.probe_delay
    driver.condition = t.VolumeCondition(abnormal=False, message=args.healthy_message)
    driver.fail.update(_fault(item) for item in args.fail)
    for item in args.sleep:
        rpc, _, seconds = item.partition("=")
        driver.sleep[rpc] = float(seconds)
    driver.entered_dir = args.entered_dir

    env = dict(os.environ)
    if args.mode:
        env["X_CSI_MODE"] = args.mode
    endpoint = f"unix://{args.endpoint}" if args.endpoint else None
    return serve(driver.plugin(), endpoint, env=env, grace=1.0)


if __name__ == "__main__":
    raise SystemExit(main())
