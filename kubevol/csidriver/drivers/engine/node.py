"""The bundled drivers' Node service, per the CSI spec.

Staging and publishing are idempotent (same arguments: OK, other arguments at the same path:
ALREADY_EXISTS); unstaging and unpublishing what is not staged or published answer OK. A
second publish target is refused with FAILED_PRECONDITION unless the access mode allows
several (MULTI_NODE_* and SINGLE_NODE_MULTI_WRITER). With STAGE_UNSTAGE_VOLUME advertised,
publishing needs the volume staged at ``staging_target_path``.
"""

from __future__ import annotations

import os
import stat

import attrs

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.drivers.engine import checks
from kubevol.csidriver.drivers.engine.core import Engine
from kubevol.csidriver.drivers.engine.records import (
    AccessKind,
    Publication,
    Staging,
    VolumeRecord,
)
from kubevol.csidriver.drivers.engine.rpc import Code, absolute_path, capability, fail, require
from kubevol.csidriver.drivers.engine.settings import MULTI_TARGET_MODES, READ_ONLY_MODES
from kubevol.csidriver.server.services import Context, Message, NodeService

Cap = t.NodeCapability


class EngineNode(NodeService):
    """Node RPCs over an :class:`~kubevol.csidriver.drivers.engine.core.Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.settings = engine.settings

    def _need(self, cap: Cap, rpc: str) -> None:
        if not self.settings.has_node(cap):
            fail(Code.UNIMPLEMENTED, f"{rpc} is not supported: {cap.name} is not advertised")

    def _volume(self, volume_id: str) -> VolumeRecord:
        found = self.engine.volume(volume_id)
        if found is None:
            fail(Code.NOT_FOUND, f"volume {volume_id!r} does not exist")
        return found

    def _check_attached(self, vol: VolumeRecord) -> None:
        if self.settings.attach_required and self.settings.node_id not in vol.attachments:
            fail(
                Code.FAILED_PRECONDITION,
                f"volume {vol.volume_id} is not attached to node {self.settings.node_id}: "
                "call ControllerPublishVolume first",
            )

    def node_stage_volume(self, request: Message, context: Context) -> Message:
        """Stage at ``staging_target_path``; FAILED_PRECONDITION if staged elsewhere."""
        self._need(Cap.STAGE_UNSTAGE_VOLUME, "NodeStageVolume")
        require(request.volume_id, "volume_id")
        path = absolute_path(request.staging_target_path, "staging_target_path")
        cap = capability(request)
        with self.engine.locks.hold(request.volume_id):
            vol = self._volume(request.volume_id)
            checks.check_capability(self.settings, cap, vol)
            self._check_attached(vol)
            current = vol.staging
            if current is not None and current.path != path:
                fail(
                    Code.FAILED_PRECONDITION,
                    f"volume {vol.volume_id} is already staged at {current.path}",
                )
            if current is not None and current.capability != cap:
                fail(
                    Code.ALREADY_EXISTS,
                    f"volume {vol.volume_id} is staged at {path} with another capability",
                )
            wanted = current or Staging(path=path, capability=cap)
            if current is None:
                # Recorded first: whatever the backend makes is then known to be ours.
                self.engine.put_volume(attrs.evolve(vol, staging=wanted))
            try:
                staged = self.engine.backend.stage(vol, wanted, repeat=current is not None)
            except BaseException:
                if current is None and not self.engine.backend.stage_leftover(vol, wanted):
                    self.engine.put_volume(vol)
                raise
            if staged != wanted:
                self.engine.put_volume(attrs.evolve(vol, staging=staged))
        return csi_pb2.NodeStageVolumeResponse()

    def node_unstage_volume(self, request: Message, context: Context) -> Message:
        """Unstage; OK when not staged there; FAILED_PRECONDITION while still published."""
        self._need(Cap.STAGE_UNSTAGE_VOLUME, "NodeUnstageVolume")
        require(request.volume_id, "volume_id")
        path = absolute_path(request.staging_target_path, "staging_target_path")
        with self.engine.locks.hold(request.volume_id):
            vol = self.engine.volume(request.volume_id)
            if vol is None or vol.staging is None or vol.staging.path != path:
                return csi_pb2.NodeUnstageVolumeResponse()
            users = sorted(p.target_path for p in vol.publications.values())
            if users:
                fail(
                    Code.FAILED_PRECONDITION,
                    f"volume {vol.volume_id} is still published at {users}",
                )
            self.engine.backend.unstage(vol, vol.staging)
            self.engine.put_volume(attrs.evolve(vol, staging=None))
        return csi_pb2.NodeUnstageVolumeResponse()

    def node_publish_volume(self, request: Message, context: Context) -> Message:
        """Publish at ``target_path`` (created here); see the module docstring."""
        require(request.volume_id, "volume_id")
        target = absolute_path(request.target_path, "target_path")
        cap = capability(request)
        staging_path = (
            os.path.normpath(request.staging_target_path) if request.staging_target_path else ""
        )
        with self.engine.locks.hold(request.volume_id):
            vol = self._volume(request.volume_id)
            checks.check_capability(self.settings, cap, vol)
            self._check_attached(vol)
            staging = self._staging_for_publish(vol, staging_path)
            wanted = Publication(
                target_path=target,
                staging_path=staging_path,
                readonly=request.readonly or cap.access_mode in READ_ONLY_MODES,
                capability=cap,
            )
            current = vol.publications.get(target)
            if current is not None and current != wanted:
                fail(
                    Code.ALREADY_EXISTS,
                    f"volume {vol.volume_id} is published at {target} with another "
                    "capability, read-only flag or staging path",
                )
            # What is at the target before a first publish is not ours, even if it stays.
            foreign = current is None and os.path.lexists(target)
            if current is None:
                self._check_second_target(vol, cap)
                # Recorded first: the target the backend creates is then known to be ours.
                self.engine.put_volume(
                    attrs.evolve(vol, publications={**vol.publications, target: wanted})
                )
            try:
                self.engine.backend.publish(vol, wanted, staging, repeat=current is not None)
            except BaseException:
                if current is None and (
                    foreign or not self.engine.backend.publish_leftover(vol, wanted)
                ):
                    self.engine.put_volume(vol)
                raise
        return csi_pb2.NodePublishVolumeResponse()

    def _staging_for_publish(self, vol: VolumeRecord, staging_path: str) -> Staging | None:
        if not self.settings.staging_required:
            return None
        if not staging_path:
            fail(
                Code.FAILED_PRECONDITION,
                "staging_target_path is required: this driver stages volumes before publishing",
            )
        if vol.staging is None or vol.staging.path != staging_path:
            fail(
                Code.FAILED_PRECONDITION,
                f"volume {vol.volume_id} is not staged at {staging_path}",
            )
        return vol.staging

    def _check_second_target(self, vol: VolumeRecord, cap: t.VolumeCapability) -> None:
        if not vol.publications:
            return
        modes = {cap.access_mode} | {p.capability.access_mode for p in vol.publications.values()}
        if not modes <= MULTI_TARGET_MODES:
            fail(
                Code.FAILED_PRECONDITION,
                f"volume {vol.volume_id} is already published at "
                f"{sorted(vol.publications)} and its access mode allows one target",
            )

    def node_unpublish_volume(self, request: Message, context: Context) -> Message:
        """Unpublish and remove the target path; OK when not published there."""
        require(request.volume_id, "volume_id")
        target = absolute_path(request.target_path, "target_path")
        with self.engine.locks.hold(request.volume_id):
            vol = self.engine.volume(request.volume_id)
            pub = None if vol is None else vol.publications.get(target)
            if vol is None or pub is None:
                return csi_pb2.NodeUnpublishVolumeResponse()
            self.engine.backend.unpublish(vol, pub)
            remaining = {k: v for k, v in vol.publications.items() if k != target}
            self.engine.put_volume(attrs.evolve(vol, publications=remaining))
        return csi_pb2.NodeUnpublishVolumeResponse()

    def _known_path(self, vol: VolumeRecord, raw: str, *, device_binds: bool = False) -> str:
        """``raw`` normalised when the volume is staged or published there; with
        ``device_binds``, also a bind of a block volume's published device node elsewhere
        (the kubelet measures block volumes at its own bind under the global map path).
        NOT_FOUND otherwise."""
        path = os.path.normpath(raw) if raw.startswith("/") else ""
        if path and (path in vol.publications or (vol.staging and vol.staging.path == path)):
            return path
        if path and device_binds and _binds_published_device(vol, path):
            return path
        fail(Code.NOT_FOUND, f"volume {vol.volume_id} is not staged or published at {raw!r}")

    def node_get_volume_stats(self, request: Message, context: Context) -> Message:
        """Usage and condition at a target or staging path; NOT_FOUND for any other path."""
        self._need(Cap.GET_VOLUME_STATS, "NodeGetVolumeStats")
        require(request.volume_id, "volume_id")
        require(request.volume_path, "volume_path")
        vol = self._volume(request.volume_id)
        path = self._known_path(vol, request.volume_path, device_binds=True)
        stats = self.engine.backend.volume_stats(vol, path)
        if not self.settings.has_node(Cap.VOLUME_CONDITION):
            stats = attrs.evolve(stats, volume_condition=None)
        return convert.volume_stats_to_pb(stats)

    def node_expand_volume(self, request: Message, context: Context) -> Message:
        """Make the node see the volume's (controller-expanded) size."""
        self._need(Cap.EXPAND_VOLUME, "NodeExpandVolume")
        require(request.volume_id, "volume_id")
        require(request.volume_path, "volume_path")
        with self.engine.locks.hold(request.volume_id):
            vol = self._volume(request.volume_id)
            path = self._known_path(vol, request.volume_path)
            if request.HasField("volume_capability"):
                checks.check_capability(self.settings, capability(request), vol)
            required = request.capacity_range.required_bytes
            if required > vol.capacity_bytes:
                fail(
                    Code.OUT_OF_RANGE,
                    f"volume {vol.volume_id} has {vol.capacity_bytes} bytes; expand it on "
                    f"the controller before asking the node for {required}",
                )
            size = self.engine.backend.node_expand(vol, path)
        return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=size)

    def node_get_capabilities(self, request: Message, context: Context) -> Message:
        """The advertised node capabilities."""
        return convert.node_capabilities_to_pb(self.settings.node_caps)

    def node_get_info(self, request: Message, context: Context) -> Message:
        """This driver's node id and volume limit."""
        return convert.node_info_to_pb(
            t.NodeInfo(
                node_id=self.settings.node_id,
                max_volumes_per_node=self.settings.max_volumes_per_node,
            )
        )


def _binds_published_device(vol: VolumeRecord, path: str) -> bool:
    """Whether ``path`` is a block device node that is the very device published at one of
    a block volume's targets (the same device number)."""
    if vol.kind is not AccessKind.BLOCK or not vol.publications:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISBLK(st.st_mode):
        return False
    for target in vol.publications:
        try:
            if os.stat(target).st_rdev == st.st_rdev:
                return True
        except OSError:
            continue
    return False
