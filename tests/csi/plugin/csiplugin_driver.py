"""A small but real CSI driver for the CSI plugin tests, built on kubevol's framework.

Volumes are directories under a state directory (or a block device named in the volume
context); staging bind-mounts the volume at the staging path, publishing bind-mounts the
staging path (or the volume) at the target, read-only through a remount, and block
publishing binds the device node onto a file. Every request is recorded so tests can check
exactly what the plugin sent.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.errors import CSIRPCError
from kubevol.csi.server import (
    ControllerService,
    IdentityService,
    NodeService,
    ServerHandle,
    StoragePlugin,
    serve_in_background,
)
from kubevol.mount import LinuxMounter

DRIVER_NAME = "dir.csi.kubevol.io"
NODE_ID = "csi-node-7"


class DirDriver:
    """State and knobs shared by the services. Thread-safe."""

    def __init__(
        self,
        state_dir: Path,
        *,
        name: str = DRIVER_NAME,
        node_caps: set[t.NodeCapability] | None = None,
        controller_caps: set[t.ControllerCapability] | None = None,
        max_volumes: int = 0,
        shared_device: str = "",
    ) -> None:
        self.state_dir = state_dir
        # Lustre's shape: every volume is a sub-directory of ONE filesystem, staging mounts
        # that filesystem (root "/") and publishing binds the volume's sub-directory.
        self.shared_device = shared_device
        self.name = name
        self.node_caps = (
            {t.NodeCapability.STAGE_UNSTAGE_VOLUME, t.NodeCapability.GET_VOLUME_STATS}
            if node_caps is None else node_caps
        )
        self.controller_caps = controller_caps or set()
        self.node_id = NODE_ID
        self.max_volumes = max_volumes
        self.condition: t.VolumeCondition | None = None
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.fail: dict[str, tuple[grpc.StatusCode, str]] = {}
        self.published: dict[str, str] = {}
        self.lock = threading.Lock()
        self.mounter = LinuxMounter()

    def record(self, rpc: str, request: Any) -> None:
        """Remember the request; fail it if told to."""
        with self.lock:
            self.requests.append((rpc, MessageToDict(request, preserving_proto_field_name=True)))
            failure = self.fail.get(rpc)
        if failure is not None:
            raise CSIRPCError(*failure)

    def calls(self, rpc: str) -> list[dict[str, Any]]:
        """The recorded requests of one RPC, in order."""
        with self.lock:
            return [r for name, r in self.requests if name == rpc]

    def names(self) -> list[str]:
        """Every RPC called, in order (capability and info queries left out)."""
        skip = {"NodeGetCapabilities", "ControllerGetCapabilities", "NodeGetInfo",
                "GetPluginInfo", "GetPluginCapabilities", "Probe"}
        with self.lock:
            return [name for name, _ in self.requests if name not in skip]

    def volume_dir(self, volume_id: str) -> Path:
        """The directory backing ``volume_id`` (created on first use)."""
        path = self.state_dir / "vols" / volume_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def is_mounted(self, path: str) -> bool:
        """Whether ``path`` is a mount point."""
        return os.path.lexists(path) and self.mounter.is_mount_point(path)


class _Identity(IdentityService):
    def __init__(self, d: DirDriver) -> None:
        self.d = d

    def get_plugin_info(self, request: Any, context: Any) -> Any:
        return convert.plugin_info_to_pb(t.PluginInfo(name=self.d.name, vendor_version="0.1"))

    def get_plugin_capabilities(self, request: Any, context: Any) -> Any:
        services = {t.PluginServiceType.CONTROLLER_SERVICE} if self.d.controller_caps else set()
        return convert.plugin_capabilities_to_pb(t.PluginCapabilities(services=services))


class _Controller(ControllerService):
    def __init__(self, d: DirDriver) -> None:
        self.d = d

    def controller_get_capabilities(self, request: Any, context: Any) -> Any:
        return convert.controller_capabilities_to_pb(self.d.controller_caps)

    def controller_publish_volume(self, request: Any, context: Any) -> Any:
        self.d.record("ControllerPublishVolume", request)
        if request.node_id != self.d.node_id:
            raise CSIRPCError(grpc.StatusCode.NOT_FOUND, f"no node {request.node_id}")
        with self.d.lock:
            self.d.published[request.volume_id] = request.node_id
        return csi_pb2.ControllerPublishVolumeResponse(
            publish_context={
                "devicePath": f"/dev/fake/{request.volume_id}", "attachedTo": request.node_id
            }
        )

    def controller_unpublish_volume(self, request: Any, context: Any) -> Any:
        self.d.record("ControllerUnpublishVolume", request)
        with self.d.lock:
            self.d.published.pop(request.volume_id, None)
        return csi_pb2.ControllerUnpublishVolumeResponse()

    def controller_expand_volume(self, request: Any, context: Any) -> Any:
        self.d.record("ControllerExpandVolume", request)
        return csi_pb2.ControllerExpandVolumeResponse(
            capacity_bytes=request.capacity_range.required_bytes, node_expansion_required=True
        )


class _Node(NodeService):
    def __init__(self, d: DirDriver) -> None:
        self.d = d

    def node_get_capabilities(self, request: Any, context: Any) -> Any:
        return convert.node_capabilities_to_pb(self.d.node_caps)

    def node_get_info(self, request: Any, context: Any) -> Any:
        self.d.record("NodeGetInfo", request)
        return convert.node_info_to_pb(
            t.NodeInfo(
                node_id=self.d.node_id,
                max_volumes_per_node=self.d.max_volumes,
                accessible_topology=t.Topology(segments={"topology.kubevol.io/node": "n1"}),
            )
        )

    def node_stage_volume(self, request: Any, context: Any) -> Any:
        self.d.record("NodeStageVolume", request)
        target = request.staging_target_path
        if not os.path.isdir(target):
            raise CSIRPCError(grpc.StatusCode.FAILED_PRECONDITION, f"{target} does not exist")
        if request.volume_capability.WhichOneof("access_type") != "mount" or self.d.is_mounted(
            target
        ):
            return csi_pb2.NodeStageVolumeResponse()
        if self.d.shared_device:
            self.d.mounter.mount(self.d.shared_device, target, "ext4", [])
            os.makedirs(os.path.join(target, request.volume_id), exist_ok=True)
        else:
            self.d.mounter.mount(str(self.d.volume_dir(request.volume_id)), target, "", ["bind"])
        return csi_pb2.NodeStageVolumeResponse()

    def node_unstage_volume(self, request: Any, context: Any) -> Any:
        self.d.record("NodeUnstageVolume", request)
        while self.d.is_mounted(request.staging_target_path):
            self.d.mounter.unmount(request.staging_target_path)
        return csi_pb2.NodeUnstageVolumeResponse()

    def node_publish_volume(self, request: Any, context: Any) -> Any:
        self.d.record("NodePublishVolume", request)
        target = request.target_path
        if self.d.is_mounted(target):
            return csi_pb2.NodePublishVolumeResponse()
        options = ["bind", "ro"] if request.readonly else ["bind"]
        if request.volume_capability.WhichOneof("access_type") == "block":
            device = request.volume_context.get("device", "")
            if not device:
                raise CSIRPCError(grpc.StatusCode.INVALID_ARGUMENT, "no device in volume context")
            with open(target, "a"):
                pass
            self.d.mounter.mount(device, target, "", options)
            return csi_pb2.NodePublishVolumeResponse()
        source = request.staging_target_path or str(self.d.volume_dir(request.volume_id))
        if self.d.shared_device and request.staging_target_path:
            source = os.path.join(request.staging_target_path, request.volume_id)
        os.makedirs(target, exist_ok=True)
        self.d.mounter.mount(source, target, "", options)
        return csi_pb2.NodePublishVolumeResponse()

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        self.d.record("NodeUnpublishVolume", request)
        target = request.target_path
        while self.d.is_mounted(target):
            self.d.mounter.unmount(target)
        if os.path.isdir(target):
            os.rmdir(target)
        elif os.path.lexists(target):
            os.unlink(target)
        return csi_pb2.NodeUnpublishVolumeResponse()

    def node_get_volume_stats(self, request: Any, context: Any) -> Any:
        self.d.record("NodeGetVolumeStats", request)
        if not os.path.exists(request.volume_path):
            raise CSIRPCError(grpc.StatusCode.NOT_FOUND, f"{request.volume_path} not found")
        st = os.statvfs(request.volume_path)
        stats = t.VolumeStats(
            usage=[
                t.VolumeUsage(unit=t.UsageUnit.BYTES, total=st.f_blocks * st.f_frsize,
                              available=st.f_bavail * st.f_frsize,
                              used=(st.f_blocks - st.f_bfree) * st.f_frsize),
                t.VolumeUsage(unit=t.UsageUnit.INODES, total=st.f_files,
                              available=st.f_ffree, used=st.f_files - st.f_ffree),
            ],
            volume_condition=self.d.condition,
        )
        return convert.volume_stats_to_pb(stats)

    def node_expand_volume(self, request: Any, context: Any) -> Any:
        self.d.record("NodeExpandVolume", request)
        capacity = request.capacity_range.required_bytes
        return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=capacity)


def serve_dir_driver(driver: DirDriver, socket_path: Path) -> ServerHandle:
    """Serve ``driver`` on a unix socket (no middleware)."""
    plugin = StoragePlugin(
        identity=_Identity(driver), controller=_Controller(driver), node=_Node(driver)
    )
    return serve_in_background(plugin, f"unix://{socket_path}", env={})


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below ``base``, deepest last as in the mount table."""
    from kubevol.mount import parse_mountinfo

    prefix = str(base).rstrip("/") + "/"
    return [e.mount_point for e in parse_mountinfo()
            if e.mount_point == str(base) or e.mount_point.startswith(prefix)]


def unmount_all_under(base: Path) -> list[str]:
    """Unmount everything below ``base`` (last mounted first); returns what was unmounted."""
    import subprocess

    done = []
    for point in reversed(mounts_under(base)):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        done.append(point)
    return done


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative, directories ending in '/', sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames:
            out.append(os.path.normpath(os.path.join(rel, name)) + "/")
        for name in filenames:
            out.append(os.path.normpath(os.path.join(rel, name)))
    return sorted(out)



def detach_loops_under(base: Path) -> list[str]:
    """Detach loop devices whose backing file lies below ``base``; returns them."""
    import subprocess

    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
                         capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(str(base)):
            subprocess.run(["losetup", "-d", parts[0]], check=False, capture_output=True)
            found.append(f"{parts[0]} ({parts[1].strip()})")
    return found
