"""The engine's Controller and Node services with what sharedfs adds: parameters checked
and completed before a volume is created, the volume context a node stages from, honest
capacity, and static volumes (a PersistentVolume written by hand, such as an Azure Lustre
one) staged from their volume context alone."""

from __future__ import annotations

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.drivers.engine import EngineController, EngineNode, VolumeRecord
from kubevol.csidriver.drivers.engine.checks import capability_problem
from kubevol.csidriver.drivers.engine.records import AccessKind
from kubevol.csidriver.drivers.engine.rpc import Code, fail
from kubevol.csidriver.drivers.sharedfs.backend import SharedFSBackend
from kubevol.csidriver.drivers.sharedfs.location import (
    FSTYPE,
    MOUNT_OPTIONS,
    SOURCE,
    STATIC,
    LocationError,
    filesystem_of,
    location_of,
    names_filesystem,
)
from kubevol.csidriver.server.services import Context, Message

#: Longest volume id a static volume may have (the CSI spec's limit for ids).
MAX_VOLUME_ID = 128


class SharedFSController(EngineController):
    """CreateVolume with checked parameters and a volume context; GetCapacity by statfs."""

    @property
    def backend(self) -> SharedFSBackend:
        backend = self.engine.backend
        assert isinstance(backend, SharedFSBackend)
        return backend

    def create_volume(self, request: Message, context: Context) -> Message:
        """Parameters that name no filesystem get the driver's default written into them
        (so the volume keeps it if the driver's default changes); INVALID_ARGUMENT for
        parameters that name no valid filesystem or sub-directory. The answer's volume
        context names the filesystem and sub-directory."""
        params = request.parameters
        default = self.backend.default
        if not names_filesystem(params) and default is not None:
            params[SOURCE] = default.source
            params[FSTYPE] = default.fstype
            if default.mount_options and MOUNT_OPTIONS not in params:
                params[MOUNT_OPTIONS] = ",".join(default.mount_options)
        if request.name:
            try:
                location_of(
                    params, name=request.name, default=default,
                    on_delete=self.backend.config.on_delete,
                )
            except LocationError as exc:
                fail(Code.INVALID_ARGUMENT, str(exc))
            if STATIC in params:
                fail(Code.INVALID_ARGUMENT, f"parameter {STATIC} is the driver's own")
        response = super().create_volume(request, context)
        record = self.engine.volume(response.volume.volume_id)
        if record is not None:
            response.volume.volume_context.update(self.backend.location(record).context())
        return response

    def get_capacity(self, request: Message, context: Context) -> Message:
        """The filesystem's free bytes (statfs, through a private mount); 0 when the
        capabilities cannot be served or no filesystem is named (no parameters and no
        driver default). Volume sizes are nominal: this is what the volumes share."""
        self._need(t.ControllerCapability.GET_CAPACITY, "GetCapacity")
        caps = [convert.capability_from_pb(c) for c in request.volume_capabilities]
        if any(capability_problem(self.settings, c) for c in caps):
            return csi_pb2.GetCapacityResponse(available_capacity=0)
        try:
            filesystem = filesystem_of(request.parameters, self.backend.default)
        except LocationError:
            return csi_pb2.GetCapacityResponse(available_capacity=0)
        free = self.backend.capacity(filesystem)
        resp = csi_pb2.GetCapacityResponse(available_capacity=free)
        resp.maximum_volume_size.value = free
        return resp


class SharedFSNode(EngineNode):
    """NodeStage of a volume this driver has no record of, from its volume context: the
    node records it as a static volume (never deleted by the driver) and forgets it after
    NodeUnstage."""

    def node_stage_volume(self, request: Message, context: Context) -> Message:
        """Stage; an unknown volume whose context names a filesystem is adopted first."""
        if (
            request.volume_id
            and request.staging_target_path
            and request.HasField("volume_capability")
            and request.volume_context
            and self.engine.volume(request.volume_id) is None
        ):
            self._adopt(request.volume_id, dict(request.volume_context))
        return super().node_stage_volume(request, context)

    def _adopt(self, volume_id: str, volume_context: dict[str, str]) -> None:
        if len(volume_id.encode()) > MAX_VOLUME_ID or "\0" in volume_id:
            fail(Code.INVALID_ARGUMENT, f"volume id {volume_id!r} is too long or has NUL")
        values = {**volume_context, STATIC: "true"}
        backend = self.engine.backend
        assert isinstance(backend, SharedFSBackend)
        try:
            location_of(values, default=backend.default)
        except LocationError as exc:
            fail(Code.NOT_FOUND, f"volume {volume_id!r} is unknown and its context: {exc}")
        with self.engine.locks.hold(volume_id):
            if self.engine.volume(volume_id) is None:
                self.engine.put_volume(
                    VolumeRecord(
                        volume_id=volume_id,
                        name=f"static:{volume_id}",
                        capacity_bytes=0,
                        kind=AccessKind.MOUNT,
                        parameters=values,
                    )
                )

    def node_unstage_volume(self, request: Message, context: Context) -> Message:
        """Unstage; a static volume no longer in use is forgotten."""
        response = super().node_unstage_volume(request, context)
        if request.volume_id:
            with self.engine.locks.hold(request.volume_id):
                vol = self.engine.volume(request.volume_id)
                if vol is not None and vol.parameters.get(STATIC) == "true" and not vol.in_use:
                    self.engine.drop_volume(vol.volume_id)
        return response
