"""The node's volume operations against a real CSI driver (the bundled hostpath driver on a
unix socket): the unstage guard is asked once per unmount_device and decides alone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.errors import DeviceStillMountedError
from kubevol.mount import guard as guard_module
from kubevol.mount.guard import RefKind, UnmountVerdict
from kubevol.mount.table import MountTable
from kubevol.node.desired import desired_pod
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import Manifests
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import MountState
from kubevol.testing.mount_rig import mounts_under, unmount_all_under


@pytest.fixture
def hostpath(tmp_path: Path) -> Iterator[str]:
    """The hostpath driver served in this process; its endpoint. Mounts under tmp_path are
    undone afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the node tests need root (real mounts)")
    running = HostPathDriver(HostPathConfig(state_dir=str(tmp_path / "hp-state"))).serve()
    try:
        yield running.endpoint
    finally:
        running.stop(grace=2)
        unmount_all_under(tmp_path)


def _pod_with_volume(handle: str) -> Manifests:
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "pod-web-1"},
        "spec": {"containers": [{"name": "c", "image": "x"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c1"}}]},
    }
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "c1", "namespace": "default"}, "spec": {"volumeName": "pv1"}}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
          "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                   "csi": {"driver": DRIVER_NAME, "volumeHandle": handle}}}
    return Manifests(pods=(pod,), pvs={"pv1": pv}, pvcs={("default", "c1"): pvc})


def _device_state(manager: NodeVolumeManager, unique_name: str) -> MountState:
    volume = manager.actual.volume(unique_name)
    assert volume is not None
    return volume.device_state


class _CountedChecks:
    """Counts the plugin's unstage verdicts and guard runs, keeps the table each guard run
    was given, and fails the test if the guard reads the mount table itself."""

    def __init__(self, runtime: NodeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.verdicts: list[UnmountVerdict] = []
        self.guard_runs: list[str] = []
        self.tables: list[MountTable | None] = []
        ask, check = runtime.csi.device_unmount_verdict, runtime.csi.context.check_unmount

        def counting(path: str, *, table: MountTable | None = None) -> UnmountVerdict:
            self.verdicts.append(ask(path, table=table))
            return self.verdicts[-1]

        def counting_guard(
            path: str, driver: str | None, *, table: MountTable | None = None
        ) -> UnmountVerdict:
            self.guard_runs.append(path)
            self.tables.append(table)
            return check(path, driver, table=table)

        def no_read(*args: object) -> bytes:
            raise AssertionError("the guard read the mount table itself")

        monkeypatch.setattr(runtime.csi, "device_unmount_verdict", counting)
        monkeypatch.setattr(runtime.csi.context, "check_unmount", counting_guard)
        monkeypatch.setattr(guard_module, "read_mountinfo_bytes", no_read)


def test_nested_mount_blocks_unstage_under_safe_with_one_guard_run(
    tmp_path: Path, hostpath: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``safe``, a bind mount nested inside the staging path (a sub-directory of the
    volume itself) blocks unmount_device: the plugin's verdict is asked exactly once, the
    device stays staged and its state unchanged; once the nested mount is gone the next
    unmount_device unstages it, again with one guard run. The guard judges on the one mount
    table the operation read for its checks: it reads none itself."""
    with CSIClient(hostpath, timeout=30) as client:
        handle = client.create_volume(
            "vol1", [t.VolumeCapability.mount()],
            capacity_range=t.CapacityRange(required_bytes=16 << 20),
        ).volume_id
    root = tmp_path / "root"
    with NodeRuntime(str(root), node_name="node-1", csi_drivers={DRIVER_NAME: hostpath},
                     guard_policy="safe") as runtime:
        manager = NodeVolumeManager(runtime.host, runtime.mgr, workers=0)
        try:
            manifests = _pod_with_volume(handle)
            manager.set_pod(desired_pod(runtime.mgr, manifests.pods[0], manifests))
            assert manager.sync(timeout=30).converged
            [av] = manager.actual.volumes()
            [mounted] = av.pods
            manager.generator.tear_down(av, mounted)()
            dmp = av.device_mount_path
            nested, sub = os.path.join(dmp, "nested"), os.path.join(dmp, "sub")
            os.mkdir(nested)
            os.mkdir(sub)
            subprocess.run(["mount", "--bind", sub, nested], check=True)

            checks = _CountedChecks(runtime, monkeypatch)
            reads = manager.usage._table.reads

            with pytest.raises(DeviceStillMountedError) as err:
                manager.generator.unmount_device(av)()
            assert err.value.refs == (nested,)
            assert len(checks.guard_runs) == len(checks.verdicts) == 1
            table = checks.tables[0]
            assert table is not None and table.find_mount_point(nested) is not None
            assert manager.usage._table.reads == reads + 1  # one read for both checks
            [ref] = checks.verdicts[0].refs
            assert (ref.mount_point, ref.kind, ref.blocking) == (nested, RefKind.SAME_VOLUME, True)
            assert dmp in mounts_under(root)
            assert _device_state(manager, av.unique_name) is MountState.MOUNTED

            subprocess.run(["umount", nested], check=True)
            manager.generator.unmount_device(av)()
            assert len(checks.guard_runs) == len(checks.verdicts) == 2
            assert mounts_under(root) == []
            assert _device_state(manager, av.unique_name) is MountState.UNMOUNTED
        finally:
            manager.close()
    with CSIClient(hostpath, timeout=30) as client:
        client.delete_volume(handle)
