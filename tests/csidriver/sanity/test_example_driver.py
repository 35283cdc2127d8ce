"""A driver written the way :mod:`kubevol.csidriver.server`'s docstring shows (subclass the
service bases, put them in a StoragePlugin, serve it) passes the conformance suite; the
groups it does not advertise are skipped."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubevol.csi import convert, pb
from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.common import serve_plugin
from kubevol.csidriver.server import ControllerService, IdentityService, NodeService, StoragePlugin
from tests.csidriver.sanity.suite import run_suite

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


class Identity(IdentityService):
    """The docstring's Identity, plus the controller service capability."""

    def get_plugin_info(self, request: Any, context: Any) -> Any:
        return convert.plugin_info_to_pb(t.PluginInfo(name="x.example.com", vendor_version="1.0"))

    def get_plugin_capabilities(self, request: Any, context: Any) -> Any:
        caps = t.PluginCapabilities(services={t.PluginServiceType.CONTROLLER_SERVICE})
        return convert.plugin_capabilities_to_pb(caps)


class Controller(ControllerService):
    """Volumes are directories under ``root``, created and deleted by name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.by_name: dict[str, tuple[str, int]] = {}
        self.lock = threading.Lock()

    def controller_get_capabilities(self, request: Any, context: Any) -> Any:
        return convert.controller_capabilities_to_pb({t.ControllerCapability.CREATE_DELETE_VOLUME})

    def create_volume(self, request: Any, context: Any) -> Any:
        size = request.capacity_range.required_bytes
        with self.lock:
            if request.name in self.by_name:
                vid, have = self.by_name[request.name]
                if size > have:
                    raise CSIRPCError(grpc.StatusCode.ALREADY_EXISTS, "exists, other size")
            else:
                vid, have = uuid.uuid4().hex, size
                (self.root / vid).mkdir()
                self.by_name[request.name] = (vid, have)
        return pb.CreateVolumeResponse(
            volume=pb.Volume(volume_id=vid, capacity_bytes=have)
        )

    def validate_volume_capabilities(self, request: Any, context: Any) -> Any:
        with self.lock:
            known = any(vid == request.volume_id for vid, _ in self.by_name.values())
        if not known:
            raise CSIRPCError(grpc.StatusCode.NOT_FOUND, f"no volume {request.volume_id}")
        resp = pb.ValidateVolumeCapabilitiesResponse()
        resp.confirmed.volume_capabilities.extend(request.volume_capabilities)
        return resp

    def delete_volume(self, request: Any, context: Any) -> Any:
        with self.lock:
            for name, (vid, _) in list(self.by_name.items()):
                if vid == request.volume_id:
                    del self.by_name[name]
                    (self.root / vid).rmdir()
        return pb.DeleteVolumeResponse()


class Node(NodeService):
    """Publishing bind-mounts the volume's directory at the target."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.published: dict[str, bool] = {}
        self.lock = threading.Lock()

    def node_get_info(self, request: Any, context: Any) -> Any:
        return convert.node_info_to_pb(t.NodeInfo(node_id="example-node"))

    def node_publish_volume(self, request: Any, context: Any) -> Any:
        source = self.root / request.volume_id
        if not source.is_dir():
            raise CSIRPCError(grpc.StatusCode.NOT_FOUND, f"no volume {request.volume_id}")
        target = request.target_path
        with self.lock:
            if target in self.published:
                if self.published[target] != request.readonly:
                    raise CSIRPCError(grpc.StatusCode.ALREADY_EXISTS, "other read-only flag")
                return pb.NodePublishVolumeResponse()
            os.makedirs(target, exist_ok=True)
            options = "bind,ro" if request.readonly else "bind"
            subprocess.run(["mount", "-o", options, str(source), target], check=True)
            self.published[target] = request.readonly
        return pb.NodePublishVolumeResponse()

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        with self.lock:
            if self.published.pop(request.target_path, None) is not None:
                subprocess.run(["umount", request.target_path], check=True)
                os.rmdir(request.target_path)
        return pb.NodeUnpublishVolumeResponse()


def test_example_driver_passes(tmp_path: Path) -> None:
    """With the framework's spec validation on, the example driver passes everything it
    advertises; unadvertised groups (staging, snapshots, stats, ...) are skipped."""
    root = tmp_path / "volumes"
    root.mkdir()
    plugin = StoragePlugin(identity=Identity(), controller=Controller(root), node=Node(root))
    env = {"X_CSI_SPEC_VALIDATION": "true"}
    with serve_plugin(plugin, env=env) as running:
        result = run_suite(running.endpoint, tmp_path / "suite")
    assert result.exit_code == 0 and not result.failed, result.describe()
    assert {"test_full_lifecycle", "test_full_lifecycle_is_idempotent"} <= result.passed
    assert {"test_create_snapshot_is_idempotent", "test_node_stage_requires_fields"} <= (
        result.skipped
    )
    assert not any(p.is_dir() for p in root.iterdir())
