"""The bundled drivers' Controller service, per the CSI spec.

Every mutating call is idempotent: a repeat with the same arguments answers what the first
call answered, a same-name creation with other arguments answers ALREADY_EXISTS, and deleting
or detaching what is not there answers OK. A call whose capability the driver does not
advertise answers UNIMPLEMENTED.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import attrs

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.drivers.engine import checks
from kubevol.csidriver.drivers.engine.backend import Source
from kubevol.csidriver.drivers.engine.core import Engine
from kubevol.csidriver.drivers.engine.records import (
    AccessKind,
    Attachment,
    SnapshotRecord,
    VolumeRecord,
)
from kubevol.csidriver.drivers.engine.rpc import (
    Code,
    capabilities,
    capability,
    fail,
    paginate,
    require,
    require_field,
)
from kubevol.csidriver.drivers.engine.settings import MULTI_TARGET_MODES
from kubevol.csidriver.server.services import Context, ControllerService, Message

Cap = t.ControllerCapability


def new_id() -> str:
    """A fresh volume or snapshot id."""
    return str(uuid.uuid4())


class EngineController(ControllerService):
    """Controller RPCs over an :class:`~kubevol.csidriver.drivers.engine.core.Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.settings = engine.settings

    def _need(self, cap: Cap, rpc: str) -> None:
        if not self.settings.has_controller(cap):
            fail(Code.UNIMPLEMENTED, f"{rpc} is not supported: {cap.name} is not advertised")

    def _volume(self, volume_id: str) -> VolumeRecord:
        found = self.engine.volume(volume_id)
        if found is None:
            fail(Code.NOT_FOUND, f"volume {volume_id!r} does not exist")
        return found

    # --- volumes --------------------------------------------------------------------

    def create_volume(self, request: Message, context: Context) -> Message:
        """Create a volume, or answer the existing one of the same name if compatible."""
        self._need(Cap.CREATE_DELETE_VOLUME, "CreateVolume")
        require(request.name, "name")
        caps = capabilities(request)
        kind = checks.kind_of(caps)
        for cap in caps:
            checks.check_capability(self.settings, cap)
        rng = (
            convert.capacity_range_from_pb(request.capacity_range)
            if request.HasField("capacity_range")
            else None
        )
        source = (
            convert.content_source_from_pb(request.volume_content_source)
            if request.HasField("volume_content_source")
            else None
        )
        params = dict(request.parameters)
        mutable = dict(request.mutable_parameters)
        self._check_mutable_keys(mutable)
        with self.engine.locks.hold(f"name:volume:{request.name}"):
            existing = self.engine.read(lambda s: s.volume_by_name(request.name))
            if existing is not None:
                self._check_same_volume(existing, kind, rng, params, source)
                return csi_pb2.CreateVolumeResponse(
                    volume=convert.volume_to_pb(existing.to_volume())
                )
            return self._create_new(
                request.name, kind, rng, params=params, mutable=mutable, source=source
            )

    def _create_new(
        self,
        name: str,
        kind: AccessKind,
        rng: t.CapacityRange | None,
        *,
        params: Mapping[str, str],
        mutable: Mapping[str, str],
        source: t.ContentSource | None,
    ) -> Message:
        source_key = ""
        if isinstance(source, t.SnapshotSource):
            source_key = f"snap:{source.snapshot_id}"
        elif isinstance(source, t.VolumeSource):
            self._need_clone()
            source_key = source.volume_id
        volume_id = new_id()
        keys = [volume_id, *([source_key] if source_key else [])]
        with self.engine.locks.hold(*keys):
            source_rec = self._source_record(source, kind)
            minimum = 0
            if isinstance(source_rec, SnapshotRecord):
                minimum = source_rec.size_bytes
            elif isinstance(source_rec, VolumeRecord):
                minimum = source_rec.capacity_bytes
            size = checks.resolve_size(self.settings, rng, minimum)
            record = VolumeRecord(
                volume_id=volume_id,
                name=name,
                capacity_bytes=size,
                kind=kind,
                parameters=params,
                mutable_parameters=mutable,
                source=source,
                created=time.time(),
            )
            with self.engine.reservation(size, self._check_room):
                try:
                    self.engine.backend.create_volume(record, source_rec)
                    self.engine.put_volume(record)
                except BaseException:
                    self.engine.backend.delete_volume(record)
                    raise
        return csi_pb2.CreateVolumeResponse(volume=convert.volume_to_pb(record.to_volume()))

    def _need_clone(self) -> None:
        if not self.settings.has_controller(Cap.CLONE_VOLUME):
            fail(Code.INVALID_ARGUMENT, f"{self.settings.name} cannot clone volumes")

    def _source_record(self, source: t.ContentSource | None, kind: AccessKind) -> Source:
        if source is None:
            return None
        found: Source
        if isinstance(source, t.SnapshotSource):
            found = self.engine.snapshot(source.snapshot_id)
            what = f"snapshot {source.snapshot_id!r}"
        else:
            found = self.engine.volume(source.volume_id)
            what = f"volume {source.volume_id!r}"
        if found is None:
            fail(Code.NOT_FOUND, f"source {what} does not exist")
        if found.kind is not kind:
            fail(
                Code.INVALID_ARGUMENT,
                f"source {what} is a {found.kind.value} volume, not {kind.value}",
            )
        return found

    def _check_room(self, used: int, size: int) -> None:
        free = self.settings.capacity_bytes - used
        if size > free:
            fail(
                Code.RESOURCE_EXHAUSTED,
                f"{size} bytes requested but only {max(free, 0)} of "
                f"{self.settings.capacity_bytes} are free",
            )

    def _check_same_volume(
        self,
        existing: VolumeRecord,
        kind: AccessKind,
        rng: t.CapacityRange | None,
        params: Mapping[str, str],
        source: t.ContentSource | None,
    ) -> None:
        problem = None
        if existing.kind is not kind:
            problem = f"it is a {existing.kind.value} volume"
        elif not checks.fits(rng, existing.capacity_bytes):
            problem = f"its capacity is {existing.capacity_bytes} bytes"
        elif dict(existing.parameters) != params:
            problem = "it has other parameters"
        elif existing.source != source:
            problem = "it has another content source"
        if problem is not None:
            fail(
                Code.ALREADY_EXISTS,
                f"volume {existing.name!r} exists ({existing.volume_id}) and {problem}",
            )

    def delete_volume(self, request: Message, context: Context) -> Message:
        """Delete a volume; OK when it does not exist; FAILED_PRECONDITION while in use."""
        self._need(Cap.CREATE_DELETE_VOLUME, "DeleteVolume")
        require(request.volume_id, "volume_id")
        with self.engine.locks.hold(request.volume_id):
            found = self.engine.volume(request.volume_id)
            if found is None:
                return csi_pb2.DeleteVolumeResponse()
            if found.in_use:
                fail(
                    Code.FAILED_PRECONDITION,
                    f"volume {found.volume_id} is still attached, staged or published",
                )
            self.engine.backend.delete_volume(found)
            self.engine.drop_volume(found.volume_id)
        return csi_pb2.DeleteVolumeResponse()

    def controller_publish_volume(self, request: Message, context: Context) -> Message:
        """Attach a volume to this driver's node; ALREADY_EXISTS when attached otherwise."""
        self._need(Cap.PUBLISH_UNPUBLISH_VOLUME, "ControllerPublishVolume")
        require(request.volume_id, "volume_id")
        require(request.node_id, "node_id")
        cap = capability(request)
        with self.engine.locks.hold(request.volume_id):
            vol = self._volume(request.volume_id)
            if request.node_id != self.settings.node_id:
                fail(Code.NOT_FOUND, f"node {request.node_id!r} does not exist")
            checks.check_capability(self.settings, cap, vol)
            wanted = Attachment(node_id=request.node_id, readonly=request.readonly, capability=cap)
            current = vol.attachments.get(request.node_id)
            if current is not None:
                if current != wanted:
                    fail(
                        Code.ALREADY_EXISTS,
                        f"volume {vol.volume_id} is attached to {request.node_id} "
                        "with another capability or read-only flag",
                    )
            else:
                self._check_attachable(vol, cap, request.node_id)
                self.engine.put_volume(
                    attrs.evolve(vol, attachments={**vol.attachments, request.node_id: wanted})
                )
        return csi_pb2.ControllerPublishVolumeResponse(
            publish_context={"attached-to": request.node_id}
        )

    def _check_attachable(self, vol: VolumeRecord, cap: t.VolumeCapability, node: str) -> None:
        if vol.attachments and cap.access_mode not in MULTI_TARGET_MODES:
            fail(
                Code.FAILED_PRECONDITION,
                f"volume {vol.volume_id} is attached to {sorted(vol.attachments)} and "
                f"{cap.access_mode.name} allows one node",
            )
        limit = self.settings.max_volumes_per_node
        if limit:
            count = self.engine.read(
                lambda s: sum(1 for v in s.volumes.values() if node in v.attachments)
            )
            if count >= limit:
                fail(
                    Code.RESOURCE_EXHAUSTED,
                    f"node {node} already has {count} volumes attached (limit {limit})",
                )

    def controller_unpublish_volume(self, request: Message, context: Context) -> Message:
        """Detach; OK when the volume or node is unknown or not attached."""
        self._need(Cap.PUBLISH_UNPUBLISH_VOLUME, "ControllerUnpublishVolume")
        require(request.volume_id, "volume_id")
        with self.engine.locks.hold(request.volume_id):
            vol = self.engine.volume(request.volume_id)
            if vol is None:
                return csi_pb2.ControllerUnpublishVolumeResponse()
            if request.node_id:
                if request.node_id not in vol.attachments:
                    return csi_pb2.ControllerUnpublishVolumeResponse()
                remaining = {k: v for k, v in vol.attachments.items() if k != request.node_id}
            else:
                remaining = {}
            self.engine.put_volume(attrs.evolve(vol, attachments=remaining))
        return csi_pb2.ControllerUnpublishVolumeResponse()

    def validate_volume_capabilities(self, request: Message, context: Context) -> Message:
        """Confirm the capabilities when the volume supports all of them."""
        require(request.volume_id, "volume_id")
        caps = capabilities(request)
        vol = self._volume(request.volume_id)
        problems = [checks.capability_problem(self.settings, c, vol.kind) for c in caps]
        if request.parameters and dict(request.parameters) != dict(vol.parameters):
            problems.append("the parameters differ from the volume's")
        found = [p for p in problems if p]
        if found:
            return csi_pb2.ValidateVolumeCapabilitiesResponse(message="; ".join(found))
        resp = csi_pb2.ValidateVolumeCapabilitiesResponse()
        resp.confirmed.volume_context.update(dict(request.volume_context))
        resp.confirmed.volume_capabilities.extend(request.volume_capabilities)
        resp.confirmed.parameters.update(dict(request.parameters))
        resp.confirmed.mutable_parameters.update(dict(request.mutable_parameters))
        return resp

    def list_volumes(self, request: Message, context: Context) -> Message:
        """One page of volumes, with their nodes and condition when advertised."""
        self._need(Cap.LIST_VOLUMES, "ListVolumes")
        page, token = paginate(
            self.engine.volumes(),
            lambda v: v.volume_id,
            request.max_entries,
            request.starting_token,
        )
        resp = csi_pb2.ListVolumesResponse(next_token=token)
        for vol in page:
            entry = resp.entries.add()
            entry.volume.CopyFrom(convert.volume_to_pb(vol.to_volume()))
            self._fill_status(entry.status, vol, Cap.LIST_VOLUMES_PUBLISHED_NODES)
        return resp

    def _fill_status(self, status: Message, vol: VolumeRecord, nodes_cap: Cap) -> None:
        if self.settings.has_controller(nodes_cap):
            status.published_node_ids.extend(sorted(vol.attachments))
        if self.settings.has_controller(Cap.VOLUME_CONDITION):
            cond = self.engine.backend.volume_condition(vol)
            status.volume_condition.abnormal = cond.abnormal
            status.volume_condition.message = cond.message

    def get_capacity(self, request: Message, context: Context) -> Message:
        """Free capacity; 0 for capabilities the driver cannot serve."""
        self._need(Cap.GET_CAPACITY, "GetCapacity")
        caps = [convert.capability_from_pb(c) for c in request.volume_capabilities]
        if any(checks.capability_problem(self.settings, c) for c in caps):
            return csi_pb2.GetCapacityResponse(available_capacity=0)
        free = max(self.settings.capacity_bytes - self.engine.used_bytes(), 0)
        resp = csi_pb2.GetCapacityResponse(available_capacity=free)
        resp.maximum_volume_size.value = min(free, self.settings.max_volume_size)
        return resp

    def controller_get_capabilities(self, request: Message, context: Context) -> Message:
        """The advertised controller capabilities."""
        return convert.controller_capabilities_to_pb(self.settings.controller_caps)

    def controller_expand_volume(self, request: Message, context: Context) -> Message:
        """Grow a volume; OK with the current size when it is already large enough."""
        self._need(Cap.EXPAND_VOLUME, "ControllerExpandVolume")
        require(request.volume_id, "volume_id")
        require_field(request, "capacity_range")
        rng = convert.capacity_range_from_pb(request.capacity_range)
        with self.engine.locks.hold(request.volume_id):
            vol = self._volume(request.volume_id)
            if request.HasField("volume_capability"):
                checks.check_capability(self.settings, capability(request), vol)
            wanted = rng.required_bytes or rng.limit_bytes
            if rng.limit_bytes and rng.required_bytes > rng.limit_bytes:
                fail(Code.OUT_OF_RANGE, "required_bytes exceeds limit_bytes")
            if rng.limit_bytes and vol.capacity_bytes > rng.limit_bytes:
                fail(
                    Code.OUT_OF_RANGE,
                    f"volume is {vol.capacity_bytes} bytes, over limit_bytes {rng.limit_bytes}",
                )
            if wanted <= vol.capacity_bytes:
                return csi_pb2.ControllerExpandVolumeResponse(
                    capacity_bytes=vol.capacity_bytes, node_expansion_required=False
                )
            if wanted > self.settings.max_volume_size:
                fail(
                    Code.OUT_OF_RANGE,
                    f"{wanted} bytes exceed the maximum volume size "
                    f"{self.settings.max_volume_size}",
                )
            growth = wanted - vol.capacity_bytes
            with self.engine.reservation(growth, self._check_expand_room):
                node_required = self.engine.backend.expand_volume(vol, wanted)
                self.engine.put_volume(attrs.evolve(vol, capacity_bytes=wanted))
        return csi_pb2.ControllerExpandVolumeResponse(
            capacity_bytes=wanted, node_expansion_required=node_required
        )

    def _check_expand_room(self, used: int, size: int) -> None:
        if size > self.settings.capacity_bytes - used:
            fail(Code.OUT_OF_RANGE, f"not enough free capacity to grow by {size} bytes")

    def controller_get_volume(self, request: Message, context: Context) -> Message:
        """One volume with the nodes it is attached to and its condition."""
        self._need(Cap.GET_VOLUME, "ControllerGetVolume")
        require(request.volume_id, "volume_id")
        vol = self._volume(request.volume_id)
        resp = csi_pb2.ControllerGetVolumeResponse()
        resp.volume.CopyFrom(convert.volume_to_pb(vol.to_volume()))
        self._fill_status(resp.status, vol, Cap.PUBLISH_UNPUBLISH_VOLUME)
        return resp

    def controller_modify_volume(self, request: Message, context: Context) -> Message:
        """Merge mutable parameters into the volume's.

        The spec calls ``mutable_parameters`` REQUIRED, but on the wire an empty map cannot
        be told from an absent one; an empty map changes nothing and answers OK (as
        csi-sanity expects). An unknown volume is NOT_FOUND whatever the parameters.
        """
        self._need(Cap.MODIFY_VOLUME, "ControllerModifyVolume")
        require(request.volume_id, "volume_id")
        mutable = dict(request.mutable_parameters)
        with self.engine.locks.hold(request.volume_id):
            vol = self._volume(request.volume_id)
            self._check_mutable_keys(mutable)
            merged = {**vol.mutable_parameters, **mutable}
            if merged != dict(vol.mutable_parameters):
                self.engine.put_volume(attrs.evolve(vol, mutable_parameters=merged))
        return csi_pb2.ControllerModifyVolumeResponse()

    def _check_mutable_keys(self, mutable: Mapping[str, str]) -> None:
        allowed = self.settings.mutable_parameter_keys
        if allowed is None:
            return
        unknown = sorted(set(mutable) - allowed)
        if unknown:
            fail(
                Code.INVALID_ARGUMENT,
                f"mutable parameters {unknown} are not supported (allowed: {sorted(allowed)})",
            )

    # --- snapshots ------------------------------------------------------------------

    def create_snapshot(self, request: Message, context: Context) -> Message:
        """Snapshot a volume, or answer the existing snapshot of the same name and source."""
        self._need(Cap.CREATE_DELETE_SNAPSHOT, "CreateSnapshot")
        require(request.name, "name")
        require(request.source_volume_id, "source_volume_id")
        with self.engine.locks.hold(f"name:snapshot:{request.name}"):
            existing = self.engine.read(lambda s: s.snapshot_by_name(request.name))
            if existing is not None:
                if existing.source_volume_id != request.source_volume_id:
                    fail(
                        Code.ALREADY_EXISTS,
                        f"snapshot {request.name!r} exists ({existing.snapshot_id}) "
                        f"of another volume, {existing.source_volume_id}",
                    )
                return csi_pb2.CreateSnapshotResponse(
                    snapshot=convert.snapshot_to_pb(existing.to_snapshot())
                )
            snap = self.cut_snapshot(
                request.source_volume_id, request.name, dict(request.parameters), ""
            )
        return csi_pb2.CreateSnapshotResponse(snapshot=convert.snapshot_to_pb(snap.to_snapshot()))

    def cut_snapshot(
        self, volume_id: str, name: str, params: Mapping[str, str], group_id: str
    ) -> SnapshotRecord:
        """Copy a volume into a new snapshot record, under the volume's lock (which the
        caller must not hold). NOT_FOUND when the volume does not exist."""
        snapshot_id = new_id()
        with self.engine.locks.hold(volume_id, f"snap:{snapshot_id}"):
            vol = self._volume(volume_id)
            snap = SnapshotRecord(
                snapshot_id=snapshot_id,
                name=name,
                source_volume_id=vol.volume_id,
                size_bytes=vol.capacity_bytes,
                kind=vol.kind,
                created=time.time(),
                parameters=params,
                group_snapshot_id=group_id,
            )
            try:
                self.engine.backend.create_snapshot(snap, vol)
                self.engine.commit(lambda s: s.snapshots.__setitem__(snapshot_id, snap))
            except BaseException:
                self.engine.backend.delete_snapshot(snap)
                raise
        return snap

    def delete_snapshot(self, request: Message, context: Context) -> Message:
        """Delete a snapshot; OK when it does not exist."""
        self._need(Cap.CREATE_DELETE_SNAPSHOT, "DeleteSnapshot")
        require(request.snapshot_id, "snapshot_id")
        with self.engine.locks.hold(f"snap:{request.snapshot_id}"):
            snap = self.engine.snapshot(request.snapshot_id)
            if snap is None:
                return csi_pb2.DeleteSnapshotResponse()
            if snap.group_snapshot_id and self.engine.group(snap.group_snapshot_id):
                fail(
                    Code.FAILED_PRECONDITION,
                    f"snapshot {snap.snapshot_id} belongs to group snapshot "
                    f"{snap.group_snapshot_id}; delete the group snapshot",
                )
            self.engine.backend.delete_snapshot(snap)
            self.engine.commit(lambda s: s.snapshots.pop(snap.snapshot_id, None))
        return csi_pb2.DeleteSnapshotResponse()

    def list_snapshots(self, request: Message, context: Context) -> Message:
        """One page of snapshots, filtered by id or source volume (unknown: empty list)."""
        self._need(Cap.LIST_SNAPSHOTS, "ListSnapshots")
        snaps = self.engine.snapshots()
        if request.snapshot_id:
            snaps = [s for s in snaps if s.snapshot_id == request.snapshot_id]
        if request.source_volume_id:
            snaps = [s for s in snaps if s.source_volume_id == request.source_volume_id]
        page, token = paginate(
            snaps, lambda s: s.snapshot_id, request.max_entries, request.starting_token
        )
        resp = csi_pb2.ListSnapshotsResponse(next_token=token)
        for snap in page:
            resp.entries.add().snapshot.CopyFrom(convert.snapshot_to_pb(snap.to_snapshot()))
        return resp

    def get_snapshot(self, request: Message, context: Context) -> Message:
        """One snapshot; NOT_FOUND when unknown."""
        self._need(Cap.GET_SNAPSHOT, "GetSnapshot")
        require(request.snapshot_id, "snapshot_id")
        snap = self.engine.snapshot(request.snapshot_id)
        if snap is None:
            fail(Code.NOT_FOUND, f"snapshot {request.snapshot_id!r} does not exist")
        return csi_pb2.GetSnapshotResponse(snapshot=convert.snapshot_to_pb(snap.to_snapshot()))
