"""A small CSI driver the manager tests run as a real subprocess, built on kubevol's server
framework. Volumes are host directories (``volume_context["source"]``) bind-mounted at the
staging path and from there (or straight from the source) at the target path.

Every RPC is appended as one JSON line to ``--log`` before it is answered, so tests can see
exactly which calls arrived and in what order.

    python plugin_driver.py --endpoint /run/x.sock --name x --log calls.jsonl [--no-stage]
        [--condition] [--probe-delay S] [--fail RPC=CODE[:TIMES] ...] [--not-ready]

``--fail`` makes an RPC fail with a status, forever or the first TIMES times.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import grpc

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.errors import CSIRPCError
from kubevol.csi.server import (
    ControllerService,
    IdentityService,
    NodeService,
    StoragePlugin,
    serve,
)
from kubevol.mount.linux import LinuxMounter

#: A file in a volume's source directory that makes its condition abnormal.
ABNORMAL_MARKER = ".abnormal"


class CallLog:
    """Appends one JSON line per RPC; the write is flushed before the RPC is answered."""

    def __init__(self, path: str, fail: Mapping[str, tuple[grpc.StatusCode, int]]) -> None:
        self._path = path
        self._fail = dict(fail)
        self._lock = threading.Lock()

    def record(self, rpc: str, **fields: Any) -> None:
        """Log ``rpc`` and fail it if the command line asked for that."""
        line = json.dumps({"rpc": rpc, "pid": os.getpid(), "t": time.monotonic(), **fields})
        with self._lock:
            with open(self._path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
            code, times = self._fail.get(rpc, (grpc.StatusCode.OK, 0))
            if times == 0:
                return
            self._fail[rpc] = (code, times - 1)
        raise CSIRPCError(code, f"{rpc} fails on purpose")


class Identity(IdentityService):
    """Identity with a configurable probe."""

    def __init__(self, args: argparse.Namespace, log: CallLog) -> None:
        self.args = args
        self.log = log

    def get_plugin_info(self, request: Any, context: Any) -> Any:
        """The plugin's name."""
        self.log.record("GetPluginInfo")
        return convert.plugin_info_to_pb(t.PluginInfo(name=self.args.name, vendor_version="1.0"))

    def get_plugin_capabilities(self, request: Any, context: Any) -> Any:
        """Controller service when serving one."""
        self.log.record("GetPluginCapabilities")
        services = {t.PluginServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS}
        if self.args.mode in ("controller", "both"):
            services.add(t.PluginServiceType.CONTROLLER_SERVICE)
        return convert.plugin_capabilities_to_pb(t.PluginCapabilities(services=services))

    def probe(self, request: Any, context: Any) -> Any:
        """Ready (unless --not-ready), after --probe-delay seconds."""
        self.log.record("Probe")
        if self.args.probe_delay:
            time.sleep(self.args.probe_delay)
        resp = csi_pb2.ProbeResponse()
        resp.ready.value = not self.args.not_ready
        return resp


class Controller(ControllerService):
    """Only capabilities."""

    def __init__(self, log: CallLog) -> None:
        self.log = log

    def controller_get_capabilities(self, request: Any, context: Any) -> Any:
        """Publish/unpublish and list volumes."""
        self.log.record("ControllerGetCapabilities")
        return convert.controller_capabilities_to_pb(
            {t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME, t.ControllerCapability.LIST_VOLUMES}
        )


class Node(NodeService):
    """Bind-mount node service."""

    def __init__(self, args: argparse.Namespace, log: CallLog) -> None:
        self.args = args
        self.log = log
        self.mounter = LinuxMounter()

    def _mounted(self, path: str) -> bool:
        return os.path.exists(path) and self.mounter.is_mount_point(path)

    def node_get_info(self, request: Any, context: Any) -> Any:
        """Node id and topology."""
        self.log.record("NodeGetInfo")
        return convert.node_info_to_pb(
            t.NodeInfo(
                node_id=self.args.node_id,
                max_volumes_per_node=7,
                accessible_topology=t.Topology(segments={"zone": "z1"}),
            )
        )

    def node_get_capabilities(self, request: Any, context: Any) -> Any:
        """STAGE_UNSTAGE unless --no-stage; stats and condition with --condition."""
        self.log.record("NodeGetCapabilities")
        caps = set()
        if not self.args.no_stage:
            caps.add(t.NodeCapability.STAGE_UNSTAGE_VOLUME)
        if self.args.condition:
            caps |= {t.NodeCapability.GET_VOLUME_STATS, t.NodeCapability.VOLUME_CONDITION}
        return convert.node_capabilities_to_pb(caps)

    def node_stage_volume(self, request: Any, context: Any) -> Any:
        """Bind the source directory at the staging path."""
        path = request.staging_target_path
        self.log.record("NodeStageVolume", volume_id=request.volume_id, path=path)
        if not self._mounted(path):
            self.mounter.mount(request.volume_context["source"], path, options=["bind"])
        return csi_pb2.NodeStageVolumeResponse()

    def node_unstage_volume(self, request: Any, context: Any) -> Any:
        """Unmount the staging path."""
        path = request.staging_target_path
        self.log.record("NodeUnstageVolume", volume_id=request.volume_id, path=path)
        if self._mounted(path):
            self.mounter.unmount(path)
        return csi_pb2.NodeUnstageVolumeResponse()

    def node_publish_volume(self, request: Any, context: Any) -> Any:
        """Bind the staging path (or the source) at the target, read-only if asked."""
        path = request.target_path
        self.log.record(
            "NodePublishVolume",
            volume_id=request.volume_id,
            path=path,
            staging=request.staging_target_path,
            readonly=request.readonly,
        )
        if self._mounted(path):
            return csi_pb2.NodePublishVolumeResponse()
        source = request.staging_target_path or request.volume_context["source"]
        os.makedirs(path, exist_ok=True)
        self.mounter.mount(source, path, options=["bind", "ro"] if request.readonly else ["bind"])
        return csi_pb2.NodePublishVolumeResponse()

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        """Unmount and remove the target."""
        path = request.target_path
        self.log.record("NodeUnpublishVolume", volume_id=request.volume_id, path=path)
        if self._mounted(path):
            self.mounter.unmount(path)
        if os.path.isdir(path):
            os.rmdir(path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    def node_get_volume_stats(self, request: Any, context: Any) -> Any:
        """Condition abnormal when the volume holds the marker file."""
        path = request.volume_path
        self.log.record("NodeGetVolumeStats", volume_id=request.volume_id, path=path)
        if not os.path.exists(path):
            raise CSIRPCError(grpc.StatusCode.NOT_FOUND, f"{path} not found")
        abnormal = os.path.exists(os.path.join(path, ABNORMAL_MARKER))
        condition = t.VolumeCondition(
            abnormal=abnormal, message="marker file found" if abnormal else "volume is fine"
        )
        return convert.volume_stats_to_pb(t.VolumeStats(volume_condition=condition))


def main() -> int:
    """Parse the command line and serve until SIGTERM."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--node-id", default="node-1")
    parser.add_argument("--mode", default="node", choices=["node", "controller", "both"])
    parser.add_argument("--log", required=True)
    parser.add_argument("--no-stage", action="store_true")
    parser.add_argument("--condition", action="store_true")
    parser.add_argument("--not-ready", action="store_true")
    parser.add_argument("--probe-delay", type=float, default=0.0)
    parser.add_argument("--fail", action="append", default=[], metavar="RPC=CODE[:TIMES]")
    args = parser.parse_args()
    fail = {}
    for item in args.fail:
        rpc, _, spec = item.partition("=")
        code, _, times = spec.partition(":")
        fail[rpc] = (grpc.StatusCode[code], int(times) if times else -1)
    log = CallLog(args.log, fail)
    plugin = StoragePlugin(
        identity=Identity(args, log),
        controller=Controller(log),
        node=Node(args, log),
    )
    return serve(plugin, f"unix://{args.endpoint}", env={"X_CSI_MODE": args.mode}, grace=1.0)


if __name__ == "__main__":
    raise SystemExit(main())
