"""``kubevol up`` of pods with the volumes every pod has: per pod, one projected volume with
three keys (a service-account token, a CA bundle, the namespace, as ``kube-api-access-*``
volumes hold) and one configMap volume (three keys); cost per pod against writing the same
files with plain ``os`` calls, in the same run.

Usage (as root: each projected volume is a tmpfs mount, as on a kubelet node)::

    unshare -m --propagation private .venv/bin/python -m benchmarks.kinds_up [--pods 1000]

kubevol's figure is what ``kubevol up`` does after loading the manifests: record the pods,
set every volume up through the node volume manager (wrapped emptyDirs with their ready
markers, the atomic writer's ``..data`` layout, tokens from the stand-in issuer, one tmpfs
per projected volume), and converge. Two references write the same file contents at the
same paths: plain files only (``os.makedirs`` + ``open``/``write``), and the same plus one
tmpfs ``mount(2)`` per projected volume (the part of the work that is the kernel's). The
pods are then taken down (not part of the figure) and nothing may be left mounted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from benchmarks.report import Row, emit, load_average
from kubevol.k8s.tokens import TokenManager, TokenRequest
from kubevol.mount import syscalls
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.node.desired import new_pods
from kubevol.node.manifests import Manifests, manifests_from_objects
from kubevol.node.records import PodRecord, PodState
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import MountState
from kubevol.testing.token_provider import StandInTokenProvider

CONFIG = {"app.properties": "greeting=hello\ncolor=blue\n" * 4, "log-level": "info\n",
          "ca.crt": "-----BEGIN CERTIFICATE-----\n" + "A" * 1100 + "\n-----END CERTIFICATE-----\n"}


def manifests(pods: int) -> Manifests:
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "app", "namespace": "bench"}, "data": CONFIG},
    ]
    for i in range(pods):
        objects.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": "bench"},
            "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": [
                {"name": "kube-api-access", "projected": {"defaultMode": 0o644, "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "app", "items": [{"key": "ca.crt",
                                                             "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "fieldPath": "metadata.namespace"}}]}},
                ]}},
                {"name": "config", "configMap": {"name": "app"}},
            ]},
        })
    return manifests_from_objects(objects, "benchmark")


def kubevol_up(root: str, wanted: Manifests, workers: int) -> tuple[float, Any]:
    """Seconds for what ``kubevol up`` does once the manifests are loaded."""
    runtime = NodeRuntime(root, node_name="bench",
                          tokens=TokenManager(StandInTokenProvider()))
    started = time.perf_counter()
    runtime.learn(wanted)
    adding = new_pods(runtime.mgr, wanted)
    pods = runtime.volume_manager(workers=workers, adding=adding)
    pods.reconstruct()
    result = pods.sync(timeout=600)
    elapsed = time.perf_counter() - started
    if not result.converged:
        raise SystemExit(f"kubevol up did not converge: {result.pending[:3]}")
    mounted = [m for m in pods.manager.actual.mounted_volumes() if m.state is MountState.MOUNTED]
    if len(mounted) != 2 * len(wanted.pods):
        raise SystemExit(f"expected {2 * len(wanted.pods)} mounted volumes, got {len(mounted)}")
    return elapsed, (runtime, pods)


def plain_os(base: str, pods: int, *, tmpfs: bool) -> float:
    """Seconds to write the same files at the same paths with plain os calls (and, with
    ``tmpfs``, mount one tmpfs per projected volume first)."""
    provider = StandInTokenProvider()
    started = time.perf_counter()
    for i in range(pods):
        pod_dir = os.path.join(base, "pods", f"uid-{i}", "volumes")
        projected = os.path.join(pod_dir, "kubernetes.io~projected", "kube-api-access")
        config = os.path.join(pod_dir, "kubernetes.io~configmap", "config")
        os.makedirs(projected)
        os.makedirs(config)
        if tmpfs:
            syscalls.mount("tmpfs", projected, "tmpfs", 0)
        token = provider.request_token(TokenRequest(
            namespace="bench", service_account="default", expiration_seconds=3607,
            pod_name=f"p{i}", pod_uid=f"uid-{i}",
        )).token
        files = {os.path.join(projected, "token"): token, os.path.join(projected, "ca.crt"):
                 CONFIG["ca.crt"], os.path.join(projected, "namespace"): "bench"}
        files.update({os.path.join(config, k): v for k, v in CONFIG.items()})
        for path, text in files.items():
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    return time.perf_counter() - started


def unmount_under(base: str) -> None:
    real = os.path.realpath(base)
    for entry in reversed(parse_mountinfo()):
        if entry.mount_point.startswith(real + "/"):
            syscalls.umount(entry.mount_point)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: the benchmark mounts tmpfs", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="kubevol-bench-kinds-")
    left: list[str] = []
    try:
        wanted = manifests(args.pods)
        print(f"{args.pods} pods, each with a projected volume (token, ca.crt, namespace) and "
              f"a configMap volume (3 keys); {load_average()} (a shared machine)")
        plain = plain_os(os.path.join(work, "plain"), args.pods, tmpfs=False)
        with_tmpfs = plain_os(os.path.join(work, "plain-tmpfs"), args.pods, tmpfs=True)
        up, (runtime, pods) = kubevol_up(os.path.join(work, "root"), wanted, args.workers)
        print(f"kubevol up: {up:.2f} s ({up / args.pods * 1e3:.2f} ms per pod); plain os "
              f"writes: {plain:.2f} s ({plain / args.pods * 1e3:.3f} ms per pod); with a "
              f"tmpfs mount per projected volume: {with_tmpfs:.2f} s "
              f"({with_tmpfs / args.pods * 1e3:.3f} ms per pod); {load_average()}")
        try:
            for record in runtime.records.all():
                runtime.records.write(PodRecord(uid=record.uid, state=PodState.TERMINATING,
                                                objects=record.objects))
            started = time.perf_counter()
            down = pods.sync(timeout=600)
            print(f"kubevol down of the same pods: {time.perf_counter() - started:.2f} s "
                  f"(converged: {down.converged})")
        finally:
            pods.close()
            runtime.close()
        emit(Row(work=f"kubevol up, {args.pods} pods (projected 3 keys + configMap)",
                 unit="ms/pod", kubevol=up / args.pods * 1e3,
                 reference=with_tmpfs / args.pods * 1e3,
                 reference_name="os writes + tmpfs mount", note=load_average()))
        emit(Row(work=f"kubevol up, {args.pods} pods, against plain files",
                 unit="ms/pod", kubevol=up / args.pods * 1e3,
                 reference=plain / args.pods * 1e3, reference_name="plain os writes",
                 note=load_average()))
        left = [e.mount_point for e in parse_mountinfo()
                if e.mount_point.startswith(os.path.realpath(os.path.join(work, "root")) + "/")]
    finally:
        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)
    if left:
        print(f"left mounted after down: {left[:5]} ...", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
