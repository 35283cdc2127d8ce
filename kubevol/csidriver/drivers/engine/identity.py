"""The bundled drivers' Identity and GroupController services."""

from __future__ import annotations

import time
import uuid

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.engine.controller import EngineController
from kubevol.csidriver.drivers.engine.core import Engine
from kubevol.csidriver.drivers.engine.records import GroupSnapshotRecord
from kubevol.csidriver.drivers.engine.rpc import Code, fail, require
from kubevol.csidriver.server.services import (
    Context,
    GroupControllerService,
    IdentityService,
    Message,
)

GroupCap = t.GroupControllerCapability


class EngineIdentity(IdentityService):
    """Name, version, capabilities, and a probe that asks the backend."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.settings = engine.settings

    def get_plugin_info(self, request: Message, context: Context) -> Message:
        """The driver's name, version and manifest."""
        return convert.plugin_info_to_pb(
            t.PluginInfo(
                name=self.settings.name,
                vendor_version=self.settings.version,
                manifest=self.settings.manifest,
            )
        )

    def get_plugin_capabilities(self, request: Message, context: Context) -> Message:
        """The advertised services and expansion modes."""
        return convert.plugin_capabilities_to_pb(
            t.PluginCapabilities(
                services=self.settings.plugin_services,
                volume_expansion=self.settings.volume_expansion,
            )
        )

    def probe(self, request: Message, context: Context) -> Message:
        """Ready when the backend's health check passes; FAILED_PRECONDITION otherwise."""
        problem = self.engine.backend.health_problem()
        if problem:
            raise CSIRPCError(Code.FAILED_PRECONDITION, problem)
        resp = csi_pb2.ProbeResponse()
        resp.ready.value = True
        return resp


class EngineGroupController(GroupControllerService):
    """Group snapshots: one member snapshot per source volume, created and deleted together."""

    def __init__(self, engine: Engine, controller: EngineController) -> None:
        self.engine = engine
        self.settings = engine.settings
        self._controller = controller

    def _need(self) -> None:
        cap = GroupCap.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT
        if cap not in self.settings.group_caps:
            fail(Code.UNIMPLEMENTED, f"group snapshots are not supported: {cap.name}")

    def group_controller_get_capabilities(self, request: Message, context: Context) -> Message:
        """The advertised group controller capabilities."""
        return convert.group_capabilities_to_pb(self.settings.group_caps)

    def _response_group(self, group: GroupSnapshotRecord, out: Message) -> None:
        out.group_snapshot_id = group.group_snapshot_id
        out.ready_to_use = True
        out.creation_time.FromNanoseconds(int(group.created * 1e9))
        for sid in group.snapshot_ids:
            snap = self.engine.snapshot(sid)
            if snap is not None:
                out.snapshots.add().CopyFrom(convert.snapshot_to_pb(snap.to_snapshot()))

    def create_volume_group_snapshot(self, request: Message, context: Context) -> Message:
        """Snapshot every source volume; the existing group of the same name and sources
        is answered again, one with other sources is ALREADY_EXISTS."""
        self._need()
        require(request.name, "name")
        sources = tuple(dict.fromkeys(request.source_volume_ids))
        require(sources, "source_volume_ids")
        resp = csi_pb2.CreateVolumeGroupSnapshotResponse()
        with self.engine.locks.hold(f"name:group:{request.name}"):
            existing = self.engine.read(lambda s: s.group_by_name(request.name))
            if existing is not None:
                if set(existing.source_volume_ids) != set(sources):
                    fail(
                        Code.ALREADY_EXISTS,
                        f"group snapshot {request.name!r} exists with other source volumes",
                    )
                self._response_group(existing, resp.group_snapshot)
                return resp
            missing = [v for v in sources if self.engine.volume(v) is None]
            if missing:
                fail(Code.NOT_FOUND, f"source volumes {missing} do not exist")
            group_id = str(uuid.uuid4())
            params = dict(request.parameters)
            members = []
            try:
                for vid in sources:
                    name = f"{request.name}/{vid}"
                    members.append(self._controller.cut_snapshot(vid, name, params, group_id))
                group = GroupSnapshotRecord(
                    group_snapshot_id=group_id,
                    name=request.name,
                    source_volume_ids=sources,
                    snapshot_ids=tuple(m.snapshot_id for m in members),
                    created=time.time(),
                    parameters=params,
                )
                self.engine.commit(lambda s: s.groups.__setitem__(group_id, group))
            except BaseException:
                self._delete_members(tuple(m.snapshot_id for m in members))
                raise
        self._response_group(group, resp.group_snapshot)
        return resp

    def _delete_members(self, snapshot_ids: tuple[str, ...]) -> None:
        for sid in snapshot_ids:
            with self.engine.locks.hold(f"snap:{sid}"):
                snap = self.engine.snapshot(sid)
                if snap is not None:
                    self.engine.backend.delete_snapshot(snap)
                    self._forget_snapshot(sid)

    def _forget_snapshot(self, snapshot_id: str) -> None:
        self.engine.commit(lambda s: s.snapshots.pop(snapshot_id, None))

    def _group(self, request: Message) -> GroupSnapshotRecord | None:
        require(request.group_snapshot_id, "group_snapshot_id")
        group = self.engine.group(request.group_snapshot_id)
        ids = set(request.snapshot_ids)
        if group is not None and ids and ids != set(group.snapshot_ids):
            fail(
                Code.FAILED_PRECONDITION,
                f"snapshot_ids do not match the members of group snapshot "
                f"{group.group_snapshot_id}",
            )
        return group

    def delete_volume_group_snapshot(self, request: Message, context: Context) -> Message:
        """Delete a group snapshot and its members; OK when it does not exist."""
        self._need()
        with self.engine.locks.hold(f"group:{request.group_snapshot_id}"):
            group = self._group(request)
            if group is not None:
                self._delete_members(group.snapshot_ids)
                self.engine.commit(lambda s: s.groups.pop(group.group_snapshot_id, None))
        return csi_pb2.DeleteVolumeGroupSnapshotResponse()

    def get_volume_group_snapshot(self, request: Message, context: Context) -> Message:
        """One group snapshot; NOT_FOUND when unknown."""
        self._need()
        group = self._group(request)
        if group is None:
            fail(Code.NOT_FOUND, f"group snapshot {request.group_snapshot_id!r} does not exist")
        resp = csi_pb2.GetVolumeGroupSnapshotResponse()
        self._response_group(group, resp.group_snapshot)
        return resp
