"""The reference side of :mod:`benchmarks.down`: the tear-down ``kubevol down`` did, issued
directly from a process of its own (``python -m benchmarks.down_direct PLAN``).

It imports only grpc, the generated CSI messages and stubs, and the standard library: no
kubevol client, no benchmark machinery (the hostpath driver, attrs), so that its start-up
is what a direct tool's would be. Every pod is torn down on one of 8 threads (kubevol's
workers), each pod's steps in the kubelet's order: NodeUnpublishVolume, the volume
directory's removal, NodeUnstageVolume, the staging directory's removal, then the pod
directory (the emptyDir's files with it). The other RPCs ``kubevol down`` caused (node and
controller capabilities, node info: argument-free) are issued as many times, on the same
threads.

The plan (JSON) names the root, the endpoint, the volume handles (pod ``i`` has handle
``i``, UID ``UUID(int=i + 1)`` and PersistentVolume ``pv<i>``), the CSI driver's name and
the RPC counts by the driver's method names.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib
import json
import os
import shutil
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

csi_pb2: Any = importlib.import_module("kubevol.csi._generated.csi_pb2")
csi_grpc: Any = importlib.import_module("kubevol.csi._generated.csi_pb2_grpc")

WORKERS = 8
PER_POD = frozenset({"node_unpublish_volume", "node_unstage_volume"})
#: Argument-free RPCs by the driver's method name: (service, RPC, request message).
ARGUMENT_FREE = {
    "get_plugin_info": ("Identity", "GetPluginInfo", "GetPluginInfoRequest"),
    "get_plugin_capabilities": ("Identity", "GetPluginCapabilities",
                                "GetPluginCapabilitiesRequest"),
    "probe": ("Identity", "Probe", "ProbeRequest"),
    "controller_get_capabilities": ("Controller", "ControllerGetCapabilities",
                                    "ControllerGetCapabilitiesRequest"),
    "node_get_capabilities": ("Node", "NodeGetCapabilities", "NodeGetCapabilitiesRequest"),
    "node_get_info": ("Node", "NodeGetInfo", "NodeGetInfoRequest"),
    "group_controller_get_capabilities": ("GroupController", "GroupControllerGetCapabilities",
                                          "GroupControllerGetCapabilitiesRequest"),
}  # fmt: skip


def sha256_hex(text: str) -> str:
    """The CSI plugin's name of a device mount directory for a volume handle."""
    return hashlib.sha256(text.encode()).hexdigest()


def tear_down(plan: dict[str, Any]) -> None:
    """Issue the plan's RPCs and removals."""
    root, handles, driver = Path(plan["root"]), plan["handles"], plan["driver"]
    rpcs: collections.Counter[str] = collections.Counter(plan["rpcs"])
    unknown = set(rpcs) - PER_POD - set(ARGUMENT_FREE)
    if unknown:
        raise SystemExit(f"the reference does not know how to repeat {sorted(unknown)}")
    endpoint = plan["endpoint"]
    channel = grpc.insecure_channel(endpoint if "://" in endpoint else f"unix://{endpoint}")
    stubs = {name: getattr(csi_grpc, f"{name}Stub")(channel)
             for name in ("Identity", "Controller", "Node", "GroupController")}  # fmt: skip

    def pod(i: int) -> None:
        handle = handles[i]
        pod_dir = root / "pods" / str(uuid.UUID(int=i + 1))
        volume_dir = pod_dir / "volumes" / "kubernetes.io~csi" / f"pv{i}"
        staging_dir = root / "plugins/kubernetes.io/csi" / driver / sha256_hex(handle)
        if rpcs["node_unpublish_volume"]:
            stubs["Node"].NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(
                    volume_id=handle, target_path=str(volume_dir / "mount")
                ),
                timeout=60,
            )
        os.unlink(volume_dir / "vol_data.json")
        with contextlib.suppress(FileNotFoundError):  # the driver removes its target
            os.rmdir(volume_dir / "mount")
        os.rmdir(volume_dir)
        if rpcs["node_unstage_volume"]:
            stubs["Node"].NodeUnstageVolume(
                csi_pb2.NodeUnstageVolumeRequest(
                    volume_id=handle, staging_target_path=str(staging_dir / "globalmount")
                ),
                timeout=60,
            )
        os.unlink(staging_dir / "vol_data.json")
        os.rmdir(staging_dir / "globalmount")
        os.rmdir(staging_dir)
        shutil.rmtree(pod_dir)

    def other(name: str) -> None:
        service, rpc, request = ARGUMENT_FREE[name]
        getattr(stubs[service], rpc)(getattr(csi_pb2, request)(), timeout=60)

    with ThreadPoolExecutor(WORKERS) as pool:
        jobs = [pool.submit(pod, i) for i in range(len(handles))]
        jobs += [pool.submit(other, n) for n, count in rpcs.items() if n not in PER_POD
                 for _ in range(count)]  # fmt: skip
        for job in jobs:
            job.result()
    channel.close()


if __name__ == "__main__":
    tear_down(json.loads(Path(sys.argv[1]).read_text()))
