"""Covers kubevol.node.manager and kubevol.node.subpaths with the common volume kinds.

The node volume manager with the volume kinds every pod has: periodic remounts bring
ConfigMap updates and fresh tokens, subPaths are bound after set-up and removed before
tear-down, and an escaping subPath leaves the volume uncertain (retried, torn down when
the pod goes) without mounting anything outside it."""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.errors import SpecError
from kubevol.k8s.objects import ManifestObjects
from kubevol.k8s.tokens import TokenManager
from kubevol.manager import VolumePluginMgr
from kubevol.node.desired import desired_pod
from kubevol.node.host import NodeVolumeHost
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import parse_manifests
from kubevol.node.state import MountState
from kubevol.plugins import LocalVolumePlugin, builtin_plugins
from kubevol.testing.mount_rig import mounts_under, unmount_all_under
from kubevol.testing.token_provider import StandInTokenProvider

POD = """
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg, namespace: ns}
data: {greeting: hello}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns, uid: uid-1}
spec:
  containers:
  - name: c
    volumeMounts:
    - {name: host, mountPath: /in, subPath: SUB}
  volumes:
  - name: config
    configMap: {name: cfg}
  - name: token
    projected:
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 1000}
  - name: host
    hostPath: {path: HOSTDIR}
"""


class Env:
    def __init__(self, tmp: Path, clock: list[datetime.datetime]) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.root.mkdir()
        self.hostdir = tmp / "hostdir"
        (self.hostdir / "inside").mkdir(parents=True)
        (self.hostdir / "inside/file").write_text("inside")
        self.objects = ManifestObjects()
        self.provider = StandInTokenProvider(clock=lambda: clock[0])
        tokens = TokenManager(self.provider, clock=lambda: clock[0], jitter=lambda: 0.0)
        self.host = NodeVolumeHost(root_dir=str(self.root), node_name="n1",
                                   objects=self.objects, tokens=tokens)
        self.mgr = VolumePluginMgr()
        self.mgr.init_plugins([p for p in builtin_plugins()
                               if not isinstance(p, LocalVolumePlugin)], host=self.host)
        self.manager = NodeVolumeManager(self.host, self.mgr, workers=0)

    def run_pod(self, sub: str) -> Any:
        manifests = parse_manifests(POD.replace("SUB", sub).replace("HOSTDIR", str(self.hostdir)))
        for obj in manifests.api_objects():
            self.objects.add(obj)
        pod = desired_pod(self.mgr, manifests.pods[0], manifests)
        self.manager.set_pod(pod)
        return pod

    def path(self, plugin: str, volume: str) -> Path:
        return self.root / "pods/uid-1/volumes" / plugin / volume


@pytest.fixture
def clock() -> list[datetime.datetime]:
    return [datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)]


@pytest.fixture
def env(tmp_path: Path, clock: list[datetime.datetime]) -> Iterator[Env]:
    e = Env(tmp_path, clock)
    try:
        yield e
    finally:
        e.manager.close()
        unmount_all_under(tmp_path)


@pytest.mark.root
def test_subpath_bound_after_set_up_and_removed_before_tear_down(env: Env) -> None:
    """The hostPath subPath is bound at volume-subpaths/host/c/0; removing the pod removes
    the bind, then the volumes, then the pod directory."""
    env.run_pod("inside")
    assert env.manager.sync(timeout=20).converged
    bind = env.root / "pods/uid-1/volume-subpaths/host/c/0"
    assert str(bind) in mounts_under(env.tmp)
    assert (bind / "file").read_text() == "inside"
    env.manager.remove_pod("uid-1")
    assert env.manager.sync(timeout=20).converged
    assert mounts_under(env.tmp) == []
    assert not (env.root / "pods/uid-1").exists()


@pytest.mark.root
def test_escaping_subpath_is_refused_and_the_volume_torn_down_later(env: Env) -> None:
    """A subPath that is a link to /etc: not converged, the error says why, nothing of /etc
    is mounted; the volume is uncertain, and goes with the pod."""
    os.symlink("/etc", env.hostdir / "evil")
    env.run_pod("evil")
    result = env.manager.sync(timeout=3)
    assert not result.converged
    assert any("not within volume path" in str(f.error) for f in result.failures)
    assert all("/etc" not in m for m in mounts_under(env.tmp))
    states = {(m.spec_name, m.state) for m in env.manager.actual.mounted_volumes()}
    assert ("host", MountState.UNCERTAIN) in states
    env.manager.remove_pod("uid-1")
    assert env.manager.sync(timeout=20).converged
    assert mounts_under(env.tmp) == []
    assert (env.hostdir / "inside/file").exists()


@pytest.mark.root
def test_remounts_bring_updates_and_fresh_tokens(
    env: Env, clock: list[datetime.datetime]
) -> None:
    """A running agent sets remount-requiring volumes up again: a changed ConfigMap and a
    token past 80% of its lifetime reach the volumes; a one-shot sync never remounts."""
    env.run_pod("inside")
    assert env.manager.sync(timeout=20).converged
    config = env.path("kubernetes.io~configmap", "config")
    token = env.path("kubernetes.io~projected", "token") / "token"
    first = token.read_text()
    env.objects.add({"kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "ns"},
                     "data": {"greeting": "bonjour"}})
    clock[0] += datetime.timedelta(seconds=850)
    assert env.manager.sync(timeout=20).converged
    assert (config / "greeting").read_text() == "hello"  # one-shot: written once
    stop = threading.Event()
    runner = threading.Thread(target=env.manager.run, args=(stop,),
                              kwargs={"period": 0.01, "remount_period": 0.05})
    runner.start()
    try:
        for _ in range(500):
            if (config / "greeting").read_text() == "bonjour" and token.read_text() != first:
                break
            stop.wait(0.02)
    finally:
        stop.set()
        runner.join()
    assert (config / "greeting").read_text() == "bonjour"
    assert token.read_text() != first
    assert env.provider.issued == 2


def test_records_keep_config_maps_but_never_secrets() -> None:
    """A pod's record holds the ConfigMaps it reads (volumes, projected sources, env) and
    no Secret; a malformed Secret fails the whole file without showing its value."""
    text = """
apiVersion: v1
kind: ConfigMap
metadata: {name: a, namespace: ns}
data: {k: v}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: b, namespace: ns}
data: {k: v}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: unused, namespace: ns}
---
apiVersion: v1
kind: Secret
metadata: {name: s, namespace: ns}
stringData: {password: canary-record-pw}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns}
spec:
  containers:
  - name: c
    env:
    - name: X
      valueFrom: {configMapKeyRef: {name: b, key: k}}
  volumes:
  - {name: v1, configMap: {name: a}}
  - {name: v2, secret: {secretName: s}}
"""
    from kubevol.node.records import PodState, records_for

    manifests = parse_manifests(text, "app.yaml")
    assert sorted(manifests.config_maps) == [("ns", "a"), ("ns", "b"), ("ns", "unused")]
    [record] = records_for(manifests, PodState.RUNNING)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in record.objects]
    assert kinds == [("Pod", "p"), ("ConfigMap", "a"), ("ConfigMap", "b")]
    assert "canary-record-pw" not in repr(record)
    bad = text.replace("stringData: {password: canary-record-pw}",
                       "data: {password: 'canary-not-base64!'}")
    with pytest.raises(SpecError) as info:
        parse_manifests(bad, "app.yaml")
    assert "app.yaml" in str(info.value) and "'password'" in str(info.value)
    assert "canary" not in str(info.value)
