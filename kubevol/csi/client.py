"""``CSIClient``: talk to any CSI driver over one long-lived gRPC channel.

Every Identity, Controller, GroupController and Node RPC (and the alpha, streaming
SnapshotMetadata ones) is a snake_case method taking and returning :mod:`kubevol.csi.types`.
Each method accepts ``timeout`` (seconds; default :data:`DEFAULT_TIMEOUT`, the kubelet's
2 minutes) and ``metadata`` (extra gRPC metadata, e.g. ``{"csi.requestid": "42"}``).

Failures raise :class:`~kubevol.csi.errors.CSIRPCError`; stage, publish and expand calls
raise :class:`~kubevol.csi.errors.CSIRPCUncertainError` (an ``UncertainProgressError``)
when the status is not final or the transport failed, as the kubelet treats them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Generic, TypeAlias, TypeVar, cast

import grpc
from google.protobuf.message import Message

from kubevol.csi import convert, pb
from kubevol.csi import types as t
from kubevol.csi._rpc import RPCS
from kubevol.csi.endpoint import parse_endpoint
from kubevol.csi.errors import error_from_rpc
from kubevol.util.lifecycle import Around, ClosesOnExit

#: Per-call timeout in seconds when none is given (the kubelet's csiTimeout).
DEFAULT_TIMEOUT = 120.0

#: RPCs that change state on the node or attach a volume: a non-final failure is uncertain.
_MAY_PROGRESS = frozenset(
    {
        "NodeStageVolume",
        "NodePublishVolume",
        "ControllerPublishVolume",
        "NodeExpandVolume",
        "ControllerExpandVolume",
    }
)

Metadata = Mapping[str, str] | None
#: The response message of a typed call.
_Answer = TypeVar("_Answer", bound=Message)
#: A client-side interceptor :func:`grpc.intercept_channel` accepts.
_Interceptor: TypeAlias = (
    grpc.UnaryUnaryClientInterceptor
    | grpc.UnaryStreamClientInterceptor
    | grpc.StreamUnaryClientInterceptor
    | grpc.StreamStreamClientInterceptor
)
#: What :meth:`CSIClient._started` gives: a unary or a server-streaming method.
_MultiCallable: TypeAlias = grpc.UnaryUnaryMultiCallable | grpc.UnaryStreamMultiCallable


_Result = TypeVar("_Result")


class StartedCall(Generic[_Result]):
    """A unary RPC sent, its answer not yet read (:meth:`CSIClient.node_get_volume_stats_started`).

    :meth:`outcome` gives what the typed method returns, or raises what it raises."""

    def __init__(self, future: grpc.Future, path: str,
                 convert_answer: Callable[[object], _Result]) -> None:
        self._future = future
        self._path = path
        self._convert = convert_answer

    def done(self) -> bool:
        """Whether the answer came (or the call failed)."""
        return bool(self._future.done())

    def when_done(self, fn: Callable[[], None]) -> None:
        """Have ``fn()`` called once the call ended (at once if it has), on gRPC's thread."""
        self._future.add_done_callback(lambda _: fn())

    def outcome(self) -> _Result:
        """The answer of the ended call; raises :class:`~kubevol.csi.errors.CSIRPCError`."""
        try:
            response = self._future.result(timeout=0)
        except Exception as exc:
            raise error_from_rpc(exc, self._path, may_progress=False) from exc
        return self._convert(response)


class CSIClient(ClosesOnExit):
    """A client for one CSI endpoint. Thread-safe; close it (or use ``with``) when done.

    ``endpoint`` is ``unix:///path.sock``, a bare absolute socket path, or ``tcp://host:port``
    (for tests). ``metadata`` is sent with every call, before per-call metadata.
    ``around_call`` wraps each wait for an answer (the node layer lets its other operations
    run meanwhile: :func:`kubevol.util.turns.given_up`).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        user_agent: str = "kubevol",
        metadata: Metadata = None,
        interceptors: Sequence[_Interceptor] = (),
        around_call: Around = nullcontext,
    ) -> None:
        self.endpoint = parse_endpoint(endpoint)
        self._around_call = around_call
        self.timeout = timeout
        self._metadata = tuple((metadata or {}).items())
        self._user_agent = user_agent
        self._interceptors = tuple(interceptors)
        self._lock = threading.Lock()
        #: None while closed for being idle (:meth:`close_if_idle`): the next call opens one.
        self._channel: grpc.Channel | None = None
        self._callables: dict[str, _MultiCallable] = {}
        self._calls = 0  # calls started and not ended (a stream until it is read or dropped)
        self._last_call = time.monotonic()  # when the last call ended, or the client was made
        self._node_caps: frozenset[t.NodeCapability] | None = None
        self._node_caps_at = 0.0  # time.monotonic() of the answer cached
        self._closed = False
        self._open_locked()

    # --- plumbing -------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel. Idempotent; later calls fail with a (transport) CSIRPCError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def close_if_idle(self, idle_for: float) -> bool:
        """Close the channel when no call is in flight and none ended for ``idle_for``
        seconds; the next call opens a new one (a connection to a unix socket: about a
        millisecond). Whether it closed it.

        An open channel keeps gRPC's threads, which cost an idle process about 0.05% of a
        core (30 ms a minute, measured here with grpcio 1.85); they end with the process's
        last channel. A long-running caller (the agent) calls this while it idles."""
        with self._lock:
            if (self._channel is None or self._calls
                    or time.monotonic() - self._last_call < idle_for):
                return False
            channel, self._channel = self._channel, None
            self._callables = {}
        channel.close()
        return True

    @property
    def channel_open(self) -> bool:
        """Whether the channel is open (it is not after :meth:`close` or while closed for
        being idle)."""
        return self._channel is not None

    @property
    def channel(self) -> grpc.Channel:
        """The underlying ``grpc.Channel`` (escape hatch, e.g. for other services' stubs).
        A channel closed by :meth:`close_if_idle` is replaced by the next call: take it
        again rather than keep it."""
        with self._lock:
            return self._open_locked()

    def __repr__(self) -> str:
        return f"CSIClient({str(self.endpoint)!r})"

    def _open_locked(self) -> grpc.Channel:
        """The channel, opened if it was closed for being idle; the lock is held. Raises
        ValueError (as gRPC does for a closed channel) once :meth:`close` was called."""
        if self._channel is None:
            if self._closed:
                raise ValueError("the client is closed")
            channel = grpc.insecure_channel(
                self.endpoint.grpc_target,
                options=[("grpc.primary_user_agent", self._user_agent)],
            )
            if self._interceptors:  # e.g. kubevol.csi.rpclog's request/response logging
                channel = grpc.intercept_channel(channel, *self._interceptors)
            self._channel = channel
        return self._channel

    @contextmanager
    def _in_flight(self, name: str) -> Iterator[_MultiCallable]:
        """The callable of RPC ``name``, the call counted in flight (the channel is not
        closed for being idle under it) until the block ends."""
        callable_ = self._started(name)
        try:
            yield callable_
        finally:
            self._ended()

    def _started(self, name: str) -> _MultiCallable:
        """The callable of RPC ``name`` on the open channel, one more call counted in
        flight; :meth:`_ended` when it ends."""
        with self._lock:
            channel = self._open_locked()
            found = self._callables.get(name)
            if found is None:
                rpc = RPCS[name]
                make = channel.unary_stream if rpc.server_streaming else channel.unary_unary
                found = make(
                    rpc.path,
                    request_serializer=rpc.request_type.SerializeToString,
                    response_deserializer=rpc.response_type.FromString,
                )
                self._callables[name] = found
            self._calls += 1
            return found

    def _ended(self) -> None:
        with self._lock:
            self._calls -= 1
            self._last_call = time.monotonic()

    def call(
        self,
        name: str,
        request: Message,
        *,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> Message:
        """Send ``request`` (a protobuf message) to RPC ``name`` and return the response message.

        The escape hatch under the typed methods; raises like them.
        """
        md = self._metadata + tuple(metadata.items()) if metadata else self._metadata
        try:
            with self._around_call(), self._in_flight(name) as rpc:
                response: Message = rpc(
                    request,
                    timeout=self.timeout if timeout is None else timeout,
                    metadata=md or None,
                )
                return response
        except Exception as exc:
            path = RPCS[name].path
            raise error_from_rpc(exc, path, may_progress=name in _MAY_PROGRESS) from exc

    def _unary(
        self,
        name: str,
        answer: type[_Answer],
        request: Message,
        *,
        timeout: float | None,
        metadata: Metadata,
    ) -> _Answer:
        """:meth:`call`, typed: ``answer`` is the response message the RPC's deserializer
        makes (:data:`kubevol.csi._rpc.RPCS`), so the cast states what gRPC guarantees."""
        return cast(_Answer, self.call(name, request, timeout=timeout, metadata=metadata))

    def _stream(
        self,
        name: str,
        answer: type[_Answer],
        request: Message,
        *,
        timeout: float | None,
        metadata: Metadata,
    ) -> Iterator[_Answer]:
        """Iterate a server-streaming RPC's responses, translating failures like :meth:`call`."""
        md = self._metadata + tuple(metadata.items()) if metadata else self._metadata
        try:
            with self._in_flight(name) as rpc:
                responses = rpc(
                    request, timeout=self.timeout if timeout is None else timeout,
                    metadata=md or None,
                )
                for response in responses:
                    yield cast(_Answer, response)
        except Exception as exc:
            raise error_from_rpc(exc, RPCS[name].path, may_progress=False) from exc

    # --- Identity -------------------------------------------------------------------

    def get_plugin_info(
        self, *, timeout: float | None = None, metadata: Metadata = None
    ) -> t.PluginInfo:
        """The driver's name, version and manifest."""
        resp = self._unary(
            "GetPluginInfo",
            pb.GetPluginInfoResponse,
            pb.GetPluginInfoRequest(),
            timeout=timeout,
            metadata=metadata,
        )
        return convert.plugin_info_from_pb(resp)

    def get_plugin_capabilities(
        self, *, timeout: float | None = None, metadata: Metadata = None
    ) -> t.PluginCapabilities:
        """Which services the driver offers and how its volumes expand."""
        resp = self._unary(
            "GetPluginCapabilities",
            pb.GetPluginCapabilitiesResponse,
            pb.GetPluginCapabilitiesRequest(),
            timeout=timeout,
            metadata=metadata,
        )
        return convert.plugin_capabilities_from_pb(resp)

    def probe(self, *, timeout: float | None = None, metadata: Metadata = None) -> bool:
        """True when the driver is ready; an unset readiness counts as ready (spec)."""
        resp = self._unary(
            "Probe", pb.ProbeResponse, pb.ProbeRequest(), timeout=timeout, metadata=metadata
        )
        return bool(resp.ready.value) if resp.HasField("ready") else True

    # --- Controller -----------------------------------------------------------------

    def create_volume(
        self,
        name: str,
        capabilities: Iterable[t.VolumeCapability],
        *,
        capacity_range: t.CapacityRange | None = None,
        parameters: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        content_source: t.ContentSource | None = None,
        accessibility_requirements: t.TopologyRequirement | None = None,
        mutable_parameters: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.Volume:
        """Create (or find, by ``name``) a volume. Idempotent on the driver's side."""
        req = pb.CreateVolumeRequest(
            name=name,
            volume_capabilities=convert.capabilities_to_pb(capabilities),
            parameters=dict(parameters or {}),
            secrets=dict(secrets or {}),
            mutable_parameters=dict(mutable_parameters or {}),
        )
        if capacity_range is not None:
            req.capacity_range.CopyFrom(convert.capacity_range_to_pb(capacity_range))
        if content_source is not None:
            req.volume_content_source.CopyFrom(convert.content_source_to_pb(content_source))
        if accessibility_requirements is not None:
            req.accessibility_requirements.CopyFrom(
                convert.topology_requirement_to_pb(accessibility_requirements)
            )
        resp = self._unary(
            "CreateVolume", pb.CreateVolumeResponse, req, timeout=timeout, metadata=metadata
        )
        return convert.volume_from_pb(resp.volume)

    def delete_volume(
        self,
        volume_id: str,
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Delete a volume; OK when it is already gone (spec)."""
        req = pb.DeleteVolumeRequest(volume_id=volume_id, secrets=dict(secrets or {}))
        self.call("DeleteVolume", req, timeout=timeout, metadata=metadata)

    def controller_publish_volume(
        self,
        volume_id: str,
        node_id: str,
        capability: t.VolumeCapability,
        *,
        readonly: bool = False,
        secrets: Mapping[str, str] | None = None,
        volume_context: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> dict[str, str]:
        """Attach a volume to a node; returns the publish context for the node calls."""
        req = pb.ControllerPublishVolumeRequest(
            volume_id=volume_id,
            node_id=node_id,
            volume_capability=convert.capability_to_pb(capability),
            readonly=readonly,
            secrets=dict(secrets or {}),
            volume_context=dict(volume_context or {}),
        )
        resp = self._unary(
            "ControllerPublishVolume",
            pb.ControllerPublishVolumeResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        )
        return dict(resp.publish_context)

    def controller_unpublish_volume(
        self,
        volume_id: str,
        node_id: str = "",
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Detach a volume from a node (from every node when ``node_id`` is empty)."""
        req = pb.ControllerUnpublishVolumeRequest(
            volume_id=volume_id, node_id=node_id, secrets=dict(secrets or {})
        )
        self.call("ControllerUnpublishVolume", req, timeout=timeout, metadata=metadata)

    def validate_volume_capabilities(
        self,
        volume_id: str,
        capabilities: Iterable[t.VolumeCapability],
        *,
        volume_context: Mapping[str, str] | None = None,
        parameters: Mapping[str, str] | None = None,
        mutable_parameters: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.ValidationResult:
        """Ask whether the volume supports ``capabilities``."""
        req = pb.ValidateVolumeCapabilitiesRequest(
            volume_id=volume_id,
            volume_capabilities=convert.capabilities_to_pb(capabilities),
            volume_context=dict(volume_context or {}),
            parameters=dict(parameters or {}),
            mutable_parameters=dict(mutable_parameters or {}),
            secrets=dict(secrets or {}),
        )
        resp = self._unary(
            "ValidateVolumeCapabilities",
            pb.ValidateVolumeCapabilitiesResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        )
        return convert.validation_from_pb(resp)

    def list_volumes(
        self,
        *,
        max_entries: int = 0,
        starting_token: str = "",
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.Page[t.VolumeEntry]:
        """One page of volumes; pass ``next_token`` back as ``starting_token``."""
        req = pb.ListVolumesRequest(max_entries=max_entries, starting_token=starting_token)
        resp = self._unary(
            "ListVolumes", pb.ListVolumesResponse, req, timeout=timeout, metadata=metadata
        )
        return t.Page(
            entries=[convert.volume_entry_from_pb(e) for e in resp.entries],
            next_token=resp.next_token,
        )

    def get_capacity(
        self,
        *,
        capabilities: Iterable[t.VolumeCapability] = (),
        parameters: Mapping[str, str] | None = None,
        accessible_topology: t.Topology | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.Capacity:
        """Capacity available for volumes with these capabilities, parameters and topology."""
        req = pb.GetCapacityRequest(
            volume_capabilities=convert.capabilities_to_pb(capabilities),
            parameters=dict(parameters or {}),
        )
        if accessible_topology is not None:
            req.accessible_topology.CopyFrom(convert.topology_to_pb(accessible_topology))
        resp = self._unary(
            "GetCapacity", pb.GetCapacityResponse, req, timeout=timeout, metadata=metadata
        )
        return convert.capacity_from_pb(resp)

    def controller_get_capabilities(
        self, *, timeout: float | None = None, metadata: Metadata = None
    ) -> frozenset[t.ControllerCapability]:
        """The controller service's capabilities."""
        resp = self._unary(
            "ControllerGetCapabilities",
            pb.ControllerGetCapabilitiesResponse,
            pb.ControllerGetCapabilitiesRequest(),
            timeout=timeout,
            metadata=metadata,
        )
        return convert.controller_capabilities_from_pb(resp)

    def create_snapshot(
        self,
        source_volume_id: str,
        name: str,
        *,
        secrets: Mapping[str, str] | None = None,
        parameters: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.Snapshot:
        """Cut (or find, by ``name``) a snapshot of a volume."""
        req = pb.CreateSnapshotRequest(
            source_volume_id=source_volume_id,
            name=name,
            secrets=dict(secrets or {}),
            parameters=dict(parameters or {}),
        )
        resp = self._unary(
            "CreateSnapshot", pb.CreateSnapshotResponse, req, timeout=timeout, metadata=metadata
        )
        return convert.snapshot_from_pb(resp.snapshot)

    def delete_snapshot(
        self,
        snapshot_id: str,
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Delete a snapshot; OK when it is already gone."""
        req = pb.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=dict(secrets or {}))
        self.call("DeleteSnapshot", req, timeout=timeout, metadata=metadata)

    def list_snapshots(
        self,
        *,
        max_entries: int = 0,
        starting_token: str = "",
        source_volume_id: str = "",
        snapshot_id: str = "",
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.Page[t.Snapshot]:
        """One page of snapshots, optionally filtered by source volume or snapshot id."""
        req = pb.ListSnapshotsRequest(
            max_entries=max_entries,
            starting_token=starting_token,
            source_volume_id=source_volume_id,
            snapshot_id=snapshot_id,
            secrets=dict(secrets or {}),
        )
        resp = self._unary(
            "ListSnapshots", pb.ListSnapshotsResponse, req, timeout=timeout, metadata=metadata
        )
        return t.Page(
            entries=[convert.snapshot_from_pb(e.snapshot) for e in resp.entries],
            next_token=resp.next_token,
        )

    def get_snapshot(
        self,
        snapshot_id: str,
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.Snapshot:
        """One snapshot by id (alpha RPC)."""
        req = pb.GetSnapshotRequest(snapshot_id=snapshot_id, secrets=dict(secrets or {}))
        resp = self._unary(
            "GetSnapshot", pb.GetSnapshotResponse, req, timeout=timeout, metadata=metadata
        )
        return convert.snapshot_from_pb(resp.snapshot)

    def controller_expand_volume(
        self,
        volume_id: str,
        capacity_range: t.CapacityRange,
        *,
        capability: t.VolumeCapability | None = None,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.ControllerExpansion:
        """Grow a volume on the storage side; says whether a node expansion must follow."""
        req = pb.ControllerExpandVolumeRequest(
            volume_id=volume_id,
            capacity_range=convert.capacity_range_to_pb(capacity_range),
            secrets=dict(secrets or {}),
        )
        if capability is not None:
            req.volume_capability.CopyFrom(convert.capability_to_pb(capability))
        resp = self._unary(
            "ControllerExpandVolume",
            pb.ControllerExpandVolumeResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        )
        return t.ControllerExpansion(
            capacity_bytes=resp.capacity_bytes,
            node_expansion_required=resp.node_expansion_required,
        )

    def controller_get_volume(
        self, volume_id: str, *, timeout: float | None = None, metadata: Metadata = None
    ) -> t.VolumeEntry:
        """One volume with its status (alpha RPC)."""
        req = pb.ControllerGetVolumeRequest(volume_id=volume_id)
        resp = self._unary(
            "ControllerGetVolume",
            pb.ControllerGetVolumeResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        )
        return convert.volume_entry_from_pb(resp)

    def controller_modify_volume(
        self,
        volume_id: str,
        mutable_parameters: Mapping[str, str],
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Change a volume's mutable parameters."""
        req = pb.ControllerModifyVolumeRequest(
            volume_id=volume_id,
            mutable_parameters=dict(mutable_parameters),
            secrets=dict(secrets or {}),
        )
        self.call("ControllerModifyVolume", req, timeout=timeout, metadata=metadata)

    # --- GroupController ------------------------------------------------------------

    def group_controller_get_capabilities(
        self, *, timeout: float | None = None, metadata: Metadata = None
    ) -> frozenset[t.GroupControllerCapability]:
        """The group controller service's capabilities."""
        resp = self._unary(
            "GroupControllerGetCapabilities",
            pb.GroupControllerGetCapabilitiesResponse,
            pb.GroupControllerGetCapabilitiesRequest(),
            timeout=timeout,
            metadata=metadata,
        )
        return convert.group_capabilities_from_pb(resp)

    def create_volume_group_snapshot(
        self,
        name: str,
        source_volume_ids: Iterable[str],
        *,
        secrets: Mapping[str, str] | None = None,
        parameters: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.VolumeGroupSnapshot:
        """Snapshot several volumes together (or find the group snapshot by ``name``)."""
        req = pb.CreateVolumeGroupSnapshotRequest(
            name=name,
            source_volume_ids=list(source_volume_ids),
            secrets=dict(secrets or {}),
            parameters=dict(parameters or {}),
        )
        resp = self._unary(
            "CreateVolumeGroupSnapshot",
            pb.CreateVolumeGroupSnapshotResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        )
        return convert.group_snapshot_from_pb(resp.group_snapshot)

    def delete_volume_group_snapshot(
        self,
        group_snapshot_id: str,
        snapshot_ids: Iterable[str],
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Delete a group snapshot and its member snapshots."""
        req = pb.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id=group_snapshot_id,
            snapshot_ids=list(snapshot_ids),
            secrets=dict(secrets or {}),
        )
        self.call("DeleteVolumeGroupSnapshot", req, timeout=timeout, metadata=metadata)

    def get_volume_group_snapshot(
        self,
        group_snapshot_id: str,
        snapshot_ids: Iterable[str],
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.VolumeGroupSnapshot:
        """One group snapshot by id."""
        req = pb.GetVolumeGroupSnapshotRequest(
            group_snapshot_id=group_snapshot_id,
            snapshot_ids=list(snapshot_ids),
            secrets=dict(secrets or {}),
        )
        resp = self._unary(
            "GetVolumeGroupSnapshot",
            pb.GetVolumeGroupSnapshotResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        )
        return convert.group_snapshot_from_pb(resp.group_snapshot)

    # --- SnapshotMetadata (alpha, streaming) ----------------------------------------

    def get_metadata_allocated(
        self,
        snapshot_id: str,
        *,
        starting_offset: int = 0,
        max_results: int = 0,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> Iterator[t.BlockMetadataChunk]:
        """Stream the allocated ranges of a block snapshot, from ``starting_offset``.

        ``timeout`` bounds the whole stream. Errors surface while iterating.
        """
        req = pb.GetMetadataAllocatedRequest(
            snapshot_id=snapshot_id,
            starting_offset=starting_offset,
            max_results=max_results,
            secrets=dict(secrets or {}),
        )
        for resp in self._stream(
            "GetMetadataAllocated",
            pb.GetMetadataAllocatedResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        ):
            yield convert.block_metadata_chunk_from_pb(resp)

    def get_metadata_delta(
        self,
        base_snapshot_id: str,
        target_snapshot_id: str,
        *,
        starting_offset: int = 0,
        max_results: int = 0,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> Iterator[t.BlockMetadataChunk]:
        """Stream the ranges that changed between two snapshots of one block volume."""
        req = pb.GetMetadataDeltaRequest(
            base_snapshot_id=base_snapshot_id,
            target_snapshot_id=target_snapshot_id,
            starting_offset=starting_offset,
            max_results=max_results,
            secrets=dict(secrets or {}),
        )
        for resp in self._stream(
            "GetMetadataDelta", pb.GetMetadataDeltaResponse, req, timeout=timeout, metadata=metadata
        ):
            yield convert.block_metadata_chunk_from_pb(resp)

    # --- Node -----------------------------------------------------------------------

    def node_stage_volume(
        self,
        volume_id: str,
        staging_target_path: str,
        capability: t.VolumeCapability,
        *,
        publish_context: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        volume_context: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Stage a volume at ``staging_target_path`` (which the caller created).

        Raises :class:`~kubevol.csi.errors.CSIRPCUncertainError` on a non-final failure.
        """
        req = pb.NodeStageVolumeRequest(
            volume_id=volume_id,
            staging_target_path=staging_target_path,
            volume_capability=convert.capability_to_pb(capability),
            publish_context=dict(publish_context or {}),
            secrets=dict(secrets or {}),
            volume_context=dict(volume_context or {}),
        )
        self.call("NodeStageVolume", req, timeout=timeout, metadata=metadata)

    def node_unstage_volume(
        self,
        volume_id: str,
        staging_target_path: str,
        *,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Undo :meth:`node_stage_volume`; OK when not staged."""
        req = pb.NodeUnstageVolumeRequest(
            volume_id=volume_id, staging_target_path=staging_target_path
        )
        self.call("NodeUnstageVolume", req, timeout=timeout, metadata=metadata)

    def node_publish_volume(
        self,
        volume_id: str,
        target_path: str,
        capability: t.VolumeCapability,
        *,
        staging_target_path: str = "",
        readonly: bool = False,
        publish_context: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        volume_context: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Publish a volume at ``target_path`` (the driver creates it).

        Raises :class:`~kubevol.csi.errors.CSIRPCUncertainError` on a non-final failure.
        """
        req = pb.NodePublishVolumeRequest(
            volume_id=volume_id,
            target_path=target_path,
            staging_target_path=staging_target_path,
            volume_capability=convert.capability_to_pb(capability),
            readonly=readonly,
            publish_context=dict(publish_context or {}),
            secrets=dict(secrets or {}),
            volume_context=dict(volume_context or {}),
        )
        self.call("NodePublishVolume", req, timeout=timeout, metadata=metadata)

    def node_unpublish_volume(
        self,
        volume_id: str,
        target_path: str,
        *,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> None:
        """Undo :meth:`node_publish_volume`; OK when not published."""
        req = pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path)
        self.call("NodeUnpublishVolume", req, timeout=timeout, metadata=metadata)

    def node_get_volume_stats(
        self,
        volume_id: str,
        volume_path: str,
        *,
        staging_target_path: str = "",
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> t.VolumeStats:
        """Usage (bytes, inodes) and condition of a published volume."""
        req = pb.NodeGetVolumeStatsRequest(
            volume_id=volume_id, volume_path=volume_path, staging_target_path=staging_target_path
        )
        resp = self._unary(
            "NodeGetVolumeStats",
            pb.NodeGetVolumeStatsResponse,
            req,
            timeout=timeout,
            metadata=metadata,
        )
        return convert.volume_stats_from_pb(resp)

    def node_get_volume_stats_started(
        self, volume_id: str, volume_path: str, *, timeout: float | None = None,
    ) -> StartedCall[t.VolumeStats]:
        """:meth:`node_get_volume_stats` sent without waiting for the answer: a caller that
        asks many volumes at once waits once for them all, with no thread per call."""
        request = pb.NodeGetVolumeStatsRequest(volume_id=volume_id, volume_path=volume_path)
        name = "NodeGetVolumeStats"
        try:
            unary = self._started(name)
        except Exception as exc:  # a closed client: as call() says it
            raise error_from_rpc(exc, RPCS[name].path, may_progress=False) from exc
        assert isinstance(unary, grpc.UnaryUnaryMultiCallable)
        try:
            future = unary.future(request, timeout=self.timeout if timeout is None else timeout,
                                  metadata=self._metadata or None)
        except Exception as exc:  # a closed channel: as call() says it
            self._ended()
            raise error_from_rpc(exc, RPCS[name].path, may_progress=False) from exc
        future.add_done_callback(lambda _: self._ended())
        return StartedCall(future, RPCS[name].path, lambda answer: convert.volume_stats_from_pb(
            cast(pb.NodeGetVolumeStatsResponse, answer)))

    def node_expand_volume(
        self,
        volume_id: str,
        volume_path: str,
        *,
        capacity_range: t.CapacityRange | None = None,
        staging_target_path: str = "",
        capability: t.VolumeCapability | None = None,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        metadata: Metadata = None,
    ) -> int:
        """Grow the filesystem of a volume on the node; returns the new capacity (0: unknown).

        Raises :class:`~kubevol.csi.errors.CSIRPCUncertainError` on a non-final failure.
        """
        req = pb.NodeExpandVolumeRequest(
            volume_id=volume_id,
            volume_path=volume_path,
            staging_target_path=staging_target_path,
            secrets=dict(secrets or {}),
        )
        if capacity_range is not None:
            req.capacity_range.CopyFrom(convert.capacity_range_to_pb(capacity_range))
        if capability is not None:
            req.volume_capability.CopyFrom(convert.capability_to_pb(capability))
        resp = self._unary(
            "NodeExpandVolume", pb.NodeExpandVolumeResponse, req, timeout=timeout, metadata=metadata
        )
        return int(resp.capacity_bytes)

    def node_get_capabilities(
        self, *, refresh: bool = False, max_age: float | None = None,
        timeout: float | None = None, metadata: Metadata = None,
    ) -> frozenset[t.NodeCapability]:
        """The node service's capabilities, asked once and cached; ``refresh`` asks again,
        ``max_age`` (seconds) asks again when the answer cached is older."""
        with self._lock:
            cached, at = self._node_caps, self._node_caps_at
        fresh = max_age is None or time.monotonic() - at <= max_age
        if cached is not None and not refresh and fresh:
            return cached
        resp = self._unary(
            "NodeGetCapabilities",
            pb.NodeGetCapabilitiesResponse,
            pb.NodeGetCapabilitiesRequest(),
            timeout=timeout,
            metadata=metadata,
        )
        caps = convert.node_capabilities_from_pb(resp)
        with self._lock:
            self._node_caps, self._node_caps_at = caps, time.monotonic()
        return caps

    def node_capabilities_known(self) -> bool:
        """Whether :meth:`node_get_capabilities` has an answer cached (answers without a
        call while it is young enough for the caller)."""
        with self._lock:
            return self._node_caps is not None

    def node_supports(self, capability: t.NodeCapability) -> bool:
        """Whether the (cached) node capabilities include ``capability``."""
        return capability in self.node_get_capabilities()

    def node_get_info(
        self, *, timeout: float | None = None, metadata: Metadata = None
    ) -> t.NodeInfo:
        """The node id, volume limit and topology the driver reports for this node."""
        resp = self._unary(
            "NodeGetInfo",
            pb.NodeGetInfoResponse,
            pb.NodeGetInfoRequest(),
            timeout=timeout,
            metadata=metadata,
        )
        return convert.node_info_from_pb(resp)
