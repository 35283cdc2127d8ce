"""The node side's ReadWriteOncePod rule (kubevol.node.operations, the kubelet's
operation_generator.go): a second pod on the node does not get a volume whose only access
mode is ReadWriteOncePod while another pod uses it, and gets it once that pod is gone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.node.desired import desired_pod
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import Manifests
from kubevol.node.operations import RWOP_IN_USE
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import MountState
from tests.csi.support import HostPathServer

pytestmark = pytest.mark.root


def manifests(handle: str, access_modes: list[str]) -> Manifests:
    """Pods web-1 and web-2 on one claim of a hostpath PV with ``access_modes``."""
    pods = tuple(
        {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c1"}}]},
        }
        for name in ("web-1", "web-2")
    )
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "c1", "namespace": "default"},
           "spec": {"volumeName": "pv1", "accessModes": access_modes}}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
          "spec": {"capacity": {"storage": "16Mi"}, "accessModes": access_modes,
                   "csi": {"driver": DRIVER_NAME, "volumeHandle": handle}}}
    return Manifests(pods=pods, pvs={"pv1": pv}, pvcs={("default", "c1"): pvc})


@pytest.fixture
def node(tmp_path: Path, serve_hostpath: HostPathServer) -> Iterator[tuple[NodeRuntime, str]]:
    """A node runtime on the hostpath driver (served in this process) and a volume of it."""
    running = serve_hostpath()
    with CSIClient(running.endpoint, timeout=30) as client:
        handle = client.create_volume(
            "v1", [t.VolumeCapability.mount()],
            capacity_range=t.CapacityRange(required_bytes=16 << 20),
        ).volume_id
    with NodeRuntime(str(tmp_path / "root"), node_name="n1",
                     csi_drivers={DRIVER_NAME: running.endpoint}) as runtime:
        yield runtime, handle


def pod_states(manager: NodeVolumeManager) -> dict[str, MountState]:
    return {p.pod_uid: p.state for p in manager.actual.mounted_volumes()}


@pytest.mark.parametrize("modes", [["ReadWriteOncePod"], ["ReadWriteOnce"]])
def test_a_second_pod_waits_for_a_read_write_once_pod_volume(
    node: tuple[NodeRuntime, str], modes: list[str]
) -> None:
    runtime, handle = node
    m = manifests(handle, modes)
    manager = NodeVolumeManager(runtime.host, runtime.mgr, workers=0)
    try:
        manager.set_pod(desired_pod(runtime.mgr, m.pods[0], m))
        assert manager.sync(timeout=30).converged
        manager.set_pod(desired_pod(runtime.mgr, m.pods[1], m))
        result = manager.sync(timeout=3)
        if modes != ["ReadWriteOncePod"]:  # the counter-check: ReadWriteOnce shares the node
            assert result.converged
            assert pod_states(manager) == {
                "uid-web-1": MountState.MOUNTED, "uid-web-2": MountState.MOUNTED}
            return
        assert not result.converged
        assert pod_states(manager) == {"uid-web-1": MountState.MOUNTED}
        errors = [str(f.error) for f in manager.executor.failures()]
        assert any(RWOP_IN_USE in e for e in errors), errors
        manager.remove_pod("uid-web-1")
        assert manager.sync(timeout=30).converged
        assert pod_states(manager) == {"uid-web-2": MountState.MOUNTED}
    finally:
        for uid in ("uid-web-1", "uid-web-2"):
            manager.remove_pod(uid)
        manager.sync(timeout=30)
        manager.close()
