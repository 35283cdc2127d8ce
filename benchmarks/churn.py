"""A churn of pods with one CSI volume each, against the bundled hostpath driver: time per
pod, and the split between kubevol and the driver.

Usage (as root: real bind mounts)::

    unshare -m --propagation private .venv/bin/python benchmarks/churn.py [--pods 500] [--batch 50]

The hostpath driver is served in-process on a unix socket; ``--pods`` volumes are created
on it first (not timed). Then, ``--batch`` pods at a time, the node volume manager brings
the pods up (attach, NodeStageVolume, NodePublishVolume, with ``vol_data.json`` files as
the kubelet writes them) and, once all are up, takes them down again (NodeUnpublish,
NodeUnstage, removal of every directory), each batch converging with ``sync``.

Time is split three ways: the driver (time inside its Node RPC handlers, measured in the
driver), gRPC (client-side call time minus the driver's), and kubevol (the rest: the
reconciler, the operation executor, the plugins, mount checks, file writes). It exits 1
if a batch does not converge or anything is left mounted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.node.desired import desired_pod
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import parse_manifests
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.call_clock import CallClock
from kubevol.testing.mount_rig import mounts_under, unmount_all_under


def manifests_for(
    i: int, handle: str, *, scratch: bool = False, uid: str | None = None, full: bool = False
) -> str:
    """Pod ``p{i}`` with a claim bound to a CSI PV of ``handle`` (and, with ``scratch``, an
    emptyDir; with ``full``, an emptyDir, a configMap of its own ConfigMap ``cm{i}`` and a
    projected service-account token as well, the pod of issue 36; with ``uid``, that
    metadata.uid), as one multi-document YAML text (JSON documents)."""
    volumes: list[dict[str, Any]] = [
        {"name": "data", "persistentVolumeClaim": {"claimName": f"c{i}"}}
    ]
    if scratch or full:
        volumes.append({"name": "scratch", "emptyDir": {}})
    if full:
        volumes.append({"name": "config", "configMap": {"name": f"cm{i}"}})
        volumes.append({"name": "token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}})
    pod_meta = {"name": f"p{i}", "namespace": "bench"} | ({"uid": uid} if uid else {})
    objects: list[dict[str, object]] = [] if not full else [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": f"cm{i}", "namespace": "bench"},
         "data": {"settings": f"pod {i}\n"}},
    ]
    objects += [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"pv{i}"},
         "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                  "csi": {"driver": DRIVER_NAME, "volumeHandle": handle}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": f"c{i}", "namespace": "bench"},
         "spec": {"volumeName": f"pv{i}", "accessModes": ["ReadWriteOnce"]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
         "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": volumes}},
    ]
    return "\n---\n".join(json.dumps(o) for o in objects)


def churn(
    runtime: NodeRuntime, pods: list[Any], *, workers: int, batch: int,
    in_driver: CallClock, in_grpc: CallClock,
) -> dict[str, tuple[float, float, float]] | None:
    """Bring ``pods`` up then down in batches; per phase (wall, driver, client call) seconds.
    None when a batch does not converge."""
    manager = NodeVolumeManager(runtime.host, runtime.mgr, workers=workers)
    phases: dict[str, tuple[float, float, float]] = {}
    try:
        for phase in ("up", "down"):
            driver_before, grpc_before = in_driver.seconds, in_grpc.seconds
            started = time.perf_counter()
            for b in range(0, len(pods), batch):
                for p in pods[b : b + batch]:
                    if phase == "up":
                        manager.set_pod(p)
                    else:
                        manager.remove_pod(p.uid)
                result = manager.sync(timeout=120)
                if not result.converged:
                    print(f"{phase} batch {b // batch} did not converge: {result}",
                          file=sys.stderr)
                    return None
            phases[phase] = (time.perf_counter() - started, in_driver.seconds - driver_before,
                             in_grpc.seconds - grpc_before)
    finally:
        manager.close()
    return phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--workers", type=int, default=8,
                        help="operation workers of the concurrent run (the split is measured "
                        "with one worker, where call times add up to less than the wall time)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: the benchmark makes real bind mounts", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="kubevol-bench-churn-")
    driver = HostPathDriver(HostPathConfig(state_dir=os.path.join(work, "hp"), node_id="n1"))
    in_driver = CallClock()
    node_service: Any = driver.plugin.node
    for rpc in ("node_stage_volume", "node_unstage_volume", "node_publish_volume",
                "node_unpublish_volume", "node_get_capabilities"):
        setattr(node_service, rpc, in_driver.wrap(getattr(node_service, rpc)))
    running = driver.serve()
    ok = True
    try:
        with CSIClient(running.endpoint, timeout=30) as client:
            handles = [
                client.create_volume(f"v{i}", [t.VolumeCapability.mount()],
                                     capacity_range=t.CapacityRange(required_bytes=16 << 20)
                                     ).volume_id
                for i in range(args.pods)
            ]
        root = os.path.join(work, "root")
        with NodeRuntime(root, node_name="n1", csi_drivers={DRIVER_NAME: running.endpoint},
                         csi_timeout=30) as runtime:
            in_grpc = CallClock()
            csi_client = runtime.registry.client(DRIVER_NAME)
            # Wrapping the instance's call counts every RPC the plugin makes through it.
            csi_client.call = in_grpc.wrap(csi_client.call)  # type: ignore[method-assign]
            pods = []
            for i, handle in enumerate(handles):
                m = parse_manifests(manifests_for(i, handle))
                pods.append(desired_pod(runtime.mgr, m.pods[0], m))
            serial = churn(runtime, pods, workers=1, batch=args.batch,
                           in_driver=in_driver, in_grpc=in_grpc)
            concurrent = churn(runtime, pods, workers=args.workers, batch=args.batch,
                               in_driver=in_driver, in_grpc=in_grpc)
        left = mounts_under(work)
        if left or serial is None or concurrent is None:
            print(f"FAILED: left mounted {left[:3]}, or a batch did not converge",
                  file=sys.stderr)
            return 1
        print(f"{args.pods} pods with one CSI volume each, hostpath driver in-process on a "
              f"unix socket, batches of {args.batch}")
        for phase, (total, drv, calls) in serial.items():
            kubevol = total - calls
            print(f"  {phase:>4}, 1 worker:  {total / args.pods * 1000:6.2f} ms per pod = "
                  f"driver {drv / args.pods * 1000:5.2f} + gRPC "
                  f"{(calls - drv) / args.pods * 1000:5.2f} + kubevol "
                  f"{kubevol / args.pods * 1000:5.2f} ms ({kubevol / total:.0%} kubevol)")
        for phase, (total, _drv, _calls) in concurrent.items():
            print(f"  {phase:>4}, {args.workers} workers: {total / args.pods * 1000:6.2f} ms "
                  f"per pod ({args.pods / total:.0f} pods/s)")
    finally:
        running.stop()
        unmount_all_under(work)
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
