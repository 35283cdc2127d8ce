"""Covers kubevol.mount.guard through kubevol.plugins.csi and kubevol.csidriver.drivers.sharedfs.

The Lustre staging case (Kubernetes issue 105323) end to end on a real network
filesystem: the bundled sharedfs driver on a real GlusterFS, driven through kubevol's
``kubernetes.io/csi`` adapter with pods.

Two PersistentVolumes are sub-directories of ONE Gluster volume; each is staged (the whole
filesystem at its global mount, one device number and root ``/`` for both) and published to
two pods. Under ``--guard-policy kubelet`` the unstage of one is refused, with the kubelet's
own words, for as long as the other is staged; under the safe policy each unstages exactly
when no pod of its own uses it. A dead Gluster server makes the volumes abnormal within the
driver's deadline, and the driver keeps answering.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.sharedfs import DRIVER_NAME, SharedFSConfig, SharedFSDriver
from kubevol.errors import DeviceStillMountedError
from kubevol.mount.guard import GuardPolicy
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.node.host import NodeVolumeHost
from kubevol.plugins.csi import CSIPlugin
from kubevol.plugins.csi.registration import DriverRegistry
from kubevol.spec import Spec
from kubevol.testing.glusterfs import GlusterServer
from kubevol.testing.mount_rig import mounts_under, unmount_all_under
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions
from tests.plugins.csi.plugin.rig import make_pod, pv_spec

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

MULTI = t.VolumeCapability.mount(t.AccessMode.MULTI_NODE_MULTI_WRITER)
#: The two volumes' pods: pv-a is used by a1 and a2, pv-b by b1 and b2.
PODS = {"pv-a": ("pod-a1", "pod-a2"), "pv-b": ("pod-b1", "pod-b2")}


def gluster_clients_under(base: Path) -> list[int]:
    """PIDs of GlusterFS FUSE clients whose mount point lies below ``base``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if args and os.path.basename(args[0]) == "glusterfs" and args[-1].startswith(
            f"{base}/"
        ):
            found.append(int(entry))
    return found


def wait_for(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    """Whether ``predicate()`` holds within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@attrs.define
class Node:
    """A kubelet root, the sharedfs driver on GlusterFS, and the CSI plugin registered."""

    base: Path
    server: GlusterServer
    running: RunningDriver
    client: CSIClient
    plugin: CSIPlugin
    host: NodeVolumeHost
    specs: dict[str, Spec] = attrs.field(factory=dict)
    handles: dict[str, str] = attrs.field(factory=dict)
    global_mounts: dict[str, str] = attrs.field(factory=dict)
    pod_paths: dict[str, str] = attrs.field(factory=dict)

    @property
    def root(self) -> Path:
        return self.base / "kubelet"

    def create(self, pv: str) -> None:
        """CreateVolume with a templated sub-directory; the PV carries the answered context."""
        claim = f"claim-{pv[-1]}"
        vol = self.client.create_volume(
            f"pvc-{pv}", [MULTI],
            parameters={"subDir": "team/${pvc.metadata.name}",
                        "csi.storage.k8s.io/pvc/name": claim,
                        "csi.storage.k8s.io/pvc/namespace": "shop"},
        )  # fmt: skip
        assert vol.volume_context["subDir"] == f"team/{claim}"
        self.handles[pv] = vol.volume_id
        self.specs[pv] = pv_spec(pv, vol.volume_id, driver=DRIVER_NAME, fs_type="",
                                 access_modes=("ReadWriteMany",),
                                 attributes=dict(vol.volume_context))

    def stage(self, pv: str) -> str:
        attacher = self.plugin.new_attacher()
        dmp = attacher.get_device_mount_path(self.specs[pv])
        attacher.mount_device(self.specs[pv], "", dmp, DeviceMounterArgs())
        self.global_mounts[pv] = dmp
        return dmp

    def start_pod(self, pv: str, pod: str) -> str:
        mounter = self.plugin.new_mounter(self.specs[pv], make_pod(uid=pod, name=pod),
                                          VolumeOptions())
        mounter.set_up(MounterArgs())
        self.pod_paths[pod] = mounter.get_path()
        return mounter.get_path()

    def stop_pod(self, pv: str, pod: str) -> None:
        self.plugin.new_unmounter(pv, pod).tear_down()

    def unstage(self, pv: str) -> None:
        self.plugin.new_detacher().unmount_device(self.global_mounts[pv])

    def blocking(self, pv: str) -> list[str]:
        verdict = self.plugin.device_unmount_verdict(self.global_mounts[pv])
        return [r.mount_point for r in verdict.blocking_refs]

    def brick(self, pv: str) -> Path:
        return self.server.brick / "team" / f"claim-{pv[-1]}"


NodeFactory = Callable[..., Node]


@pytest.fixture
def make_node(tmp_path: Path, glusterfs: GlusterServer) -> Iterator[NodeFactory]:
    """``make_node(guard_policy=...)``: a Node on the test's GlusterFS. Afterwards the test
    fails if anything is left mounted below it or a GlusterFS client of its mounts runs."""
    made: list[Node] = []

    def make(*, guard_policy: str = "safe", timeout: float = 2.0) -> Node:
        base = tmp_path / f"node{len(made)}"
        (base / "kubelet").mkdir(parents=True)
        config = SharedFSConfig(state_dir=str(base / "state"), node_id="node-1",
                                source=glusterfs.source, fstype="glusterfs", timeout=timeout)
        running = SharedFSDriver(config).serve()
        registry = DriverRegistry(node_info_timeout=10, client_timeout=30)
        plugin = CSIPlugin(registry=registry, timeout=30, attach_timeout=10,
                           guard_policy=guard_policy)
        host = NodeVolumeHost(root_dir=str(base / "kubelet"), node_name="node-1")
        plugin.init(host)
        node = Node(base, glusterfs, running, CSIClient(running.endpoint, timeout=30), plugin,
                    host)
        made.append(node)
        registry.register_driver(DRIVER_NAME, running.endpoint, ["1.0.0"])
        return node

    yield make
    left: list[str] = []
    for node in reversed(made):
        node.plugin.registry.close()
        node.client.close()
        node.running.stop(grace=2)
        left += unmount_all_under(node.base)
    bases = [node.base for node in made]
    clients_gone = wait_for(lambda: not any(gluster_clients_under(b) for b in bases))
    assert not left, f"left mounted after the test: {left}"
    assert clients_gone, f"GlusterFS clients left running: {gluster_clients_under(tmp_path)}"


def _bring_up(node: Node) -> None:
    """Create, stage and start the pods of pv-a and pv-b; each pod writes a file."""
    for pv, pods in PODS.items():
        node.create(pv)
        node.stage(pv)
        for pod in pods:
            Path(node.start_pod(pv, pod), f"{pod}.txt").write_text(pod)


def test_two_volumes_of_one_gluster_volume_have_lustres_mount_shape(
    make_node: NodeFactory,
) -> None:
    """Both global mounts are the one GlusterFS filesystem (one device number, root ``/``,
    one client); each pod sees only its volume's sub-directory, whose files are on the
    brick; Kubernetes' GetMountRefs finds the other volume's global mount."""
    node = make_node()
    _bring_up(node)
    entries = {e.mount_point: e for e in parse_mountinfo()}
    a, b = (entries[node.global_mounts[pv]] for pv in ("pv-a", "pv-b"))
    assert a.fs_type == b.fs_type == "fuse.glusterfs"
    assert a.source == b.source == node.server.source
    assert a.device == b.device and a.root == b.root == "/"
    for pv, pods in PODS.items():
        for pod in pods:
            assert entries[node.pod_paths[pod]].root == f"/team/claim-{pv[-1]}"
        assert sorted(os.listdir(node.brick(pv))) == sorted(f"{p}.txt" for p in pods)
    assert len(gluster_clients_under(node.base)) == 1  # one client for both volumes
    assert node.plugin.get_device_mount_refs(node.global_mounts["pv-a"]) == [
        node.global_mounts["pv-b"]
    ]
    stats = node.client.node_get_volume_stats(node.handles["pv-a"], node.pod_paths["pod-a1"])
    assert stats.volume_condition is not None and not stats.volume_condition.abnormal
    used = stats.by_unit(t.UsageUnit.BYTES)
    assert used is not None and used.total > 0 and used.used > 0
    for pv, pods in PODS.items():
        for pod in pods:
            node.stop_pod(pv, pod)
        node.plugin.guard_policy = GuardPolicy.SAFE
        node.unstage(pv)
    assert mounts_under(node.root) == []


def test_volumes_staged_at_once_still_share_one_client(make_node: NodeFactory) -> None:
    """Two NodeStageVolume calls at the same moment (the node manager runs operations in
    parallel) still give one client: staging of one filesystem is one at a time, the second
    binds the first (before, each mounted a client of its own and the shape was lost)."""
    node = make_node()
    for pv in PODS:
        node.create(pv)
    threads = [threading.Thread(target=node.stage, args=(pv,)) for pv in PODS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    entries = {e.mount_point: e for e in parse_mountinfo()}
    a, b = (entries[node.global_mounts[pv]] for pv in PODS)
    assert a.device == b.device and a.root == b.root == "/"
    assert len(gluster_clients_under(node.base)) == 1
    for pv in PODS:
        node.unstage(pv)


def test_kubelet_policy_refuses_unstage_while_the_other_volume_is_staged(
    make_node: NodeFactory,
) -> None:
    """Kubernetes issue 105323 on GlusterFS: with ``--guard-policy kubelet``, once pv-a's
    pods are gone its unstage is refused with the kubelet's message naming pv-b's global
    mount, and pv-b's is refused likewise after its pods go: neither ever unstages. The
    driver was never asked to unstage; the pods' files are all on the brick."""
    node = make_node(guard_policy="kubelet")
    _bring_up(node)
    dmp_a, dmp_b = node.global_mounts["pv-a"], node.global_mounts["pv-b"]
    for pod in PODS["pv-a"]:
        node.stop_pod("pv-a", pod)
    assert node.blocking("pv-a") == [dmp_b]
    with pytest.raises(DeviceStillMountedError) as err:
        node.unstage("pv-a")
    assert str(err.value) == (
        f'the device mount path "{dmp_a}" is still mounted by other references [{dmp_b}]'
    )
    for pod in PODS["pv-b"]:
        node.stop_pod("pv-b", pod)
    with pytest.raises(DeviceStillMountedError) as err:
        node.unstage("pv-b")
    assert str(err.value) == (
        f'the device mount path "{dmp_b}" is still mounted by other references [{dmp_a}]'
    )
    assert mounts_under(node.root) == [dmp_a, dmp_b]
    for pv, pods in PODS.items():
        assert sorted(os.listdir(node.brick(pv))) == sorted(f"{p}.txt" for p in pods)
    node.plugin.guard_policy = GuardPolicy.SAFE  # end the deadlock the safe way
    node.unstage("pv-a")
    node.unstage("pv-b")
    assert mounts_under(node.root) == []


def test_safe_policy_unstages_each_volume_exactly_when_its_own_pods_are_gone(
    make_node: NodeFactory,
) -> None:
    """With the safe policy pv-a's unstage is refused while one of its own pods still uses
    it (naming that pod's mount, whatever pv-b does), allowed once both are gone while pv-b
    stays staged and in use: pv-b's pods keep writing to the brick through the shared client."""
    node = make_node()
    _bring_up(node)
    node.stop_pod("pv-a", "pod-a1")
    assert node.blocking("pv-a") == [node.pod_paths["pod-a2"]]
    with pytest.raises(DeviceStillMountedError):
        node.unstage("pv-a")
    assert node.global_mounts["pv-a"] in mounts_under(node.root)
    node.stop_pod("pv-a", "pod-a2")
    assert node.blocking("pv-a") == []
    node.unstage("pv-a")
    assert node.global_mounts["pv-a"] not in mounts_under(node.root)
    assert not os.path.exists(node.global_mounts["pv-a"])
    Path(node.pod_paths["pod-b1"], "after.txt").write_text("pv-b still works")
    assert (node.brick("pv-b") / "after.txt").read_text() == "pv-b still works"
    node.stop_pod("pv-b", "pod-b1")
    with pytest.raises(DeviceStillMountedError):
        node.unstage("pv-b")
    node.stop_pod("pv-b", "pod-b2")
    node.unstage("pv-b")
    assert mounts_under(node.root) == []
    # Unstaging never deletes data: the sub-directories and the pods' files stay.
    assert sorted(os.listdir(node.brick("pv-a"))) == ["pod-a1.txt", "pod-a2.txt"]


def test_stopped_gluster_server_makes_volumes_abnormal_and_the_driver_stays_responsive(
    make_node: NodeFactory,
) -> None:
    """The brick is killed while both volumes are staged and in use: NodeGetVolumeStats (and
    the adapter's metrics) report every pod volume abnormal within the driver's deadline, the
    driver keeps answering Probe and NodeGetInfo at once, and tear-down still leaves nothing
    mounted and no client running."""
    node = make_node(timeout=2.0)
    _bring_up(node)
    node.server.stop_server()
    for pv, pods in PODS.items():
        for pod in pods:
            started = time.monotonic()
            stats = node.client.node_get_volume_stats(node.handles[pv], node.pod_paths[pod])
            assert time.monotonic() - started < 2.0 * 3
            assert stats.volume_condition is not None and stats.volume_condition.abnormal
            assert node.server.source in stats.volume_condition.message
        metrics = node.plugin.new_mounter(
            node.specs[pv], make_pod(uid=pods[0], name=pods[0]), VolumeOptions()
        ).get_metrics()
        assert metrics.abnormal is True
    started = time.monotonic()
    assert node.client.probe() is True
    assert node.client.node_get_info().node_id == "node-1"
    assert time.monotonic() - started < 1.0
    for pv, pods in PODS.items():
        for pod in pods:
            node.stop_pod(pv, pod)
        node.unstage(pv)
    assert mounts_under(node.root) == []


# --- a crash of kubevol in the middle, then reconstruction --------------------------------

CRASH_UIDS = {f"p{i}": f"00000000-0000-4000-8000-00000000000{i}" for i in (1, 2, 3)}


def _crash_manifest(tmp_path: Path, contexts: dict[str, tuple[str, dict[str, str]]]) -> Path:
    """Two PVs (sub-directories of the Gluster volume) with their claims; p1 uses pv-a, p2
    pv-b, p3 both."""
    docs = []
    for pv, (handle, context) in contexts.items():
        attrs_yaml = ", ".join(f"{k}: '{v}'" for k, v in context.items())
        docs.append(
            f"apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {pv}}}\n"
            f"spec:\n  capacity: {{storage: 1Gi}}\n  accessModes: [ReadWriteMany]\n"
            f"  csi: {{driver: {DRIVER_NAME}, volumeHandle: '{handle}', "
            f"volumeAttributes: {{{attrs_yaml}}}}}\n"
        )
        docs.append(
            f"apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: c-{pv}, "
            f"namespace: shop}}\nspec: {{volumeName: {pv}, accessModes: [ReadWriteMany]}}\n"
        )
    uses = {"p1": ["pv-a"], "p2": ["pv-b"], "p3": ["pv-a", "pv-b"]}
    for pod, pvs in uses.items():
        volumes = "".join(
            f"  - {{name: {pv}, persistentVolumeClaim: {{claimName: c-{pv}}}}}\n" for pv in pvs
        )
        docs.append(
            f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: shop, "
            f"uid: {CRASH_UIDS[pod]}}}\nspec:\n  containers: [{{name: c, image: x}}]\n"
            f"  volumes:\n{volumes}"
        )
    path = tmp_path / "pods.yaml"
    path.write_text("---\n".join(docs))
    return path


def _kubevol(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _check_reconstruction(flags: list[str], root: Path) -> None:
    """Both volumes are staged; ``kubevol reconstruct`` rebuilds them and their global
    mounts from disk (the publication the kill interrupted too: the driver did it), with no
    failure and no orphan device mount."""
    staged = [m for m in mounts_under(root) if m.endswith("/globalmount")]
    assert len(staged) == 2
    done = _kubevol("reconstruct", *flags, "-o", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rebuilt = {(v["pod_uid"], v["volume"]): v for v in report["volumes"]}
    assert (CRASH_UIDS["p3"], "pv-b") in rebuilt
    assert {v["volume"] for v in rebuilt.values()} == {"pv-a", "pv-b"}
    assert sorted({v["device_mount_path"] for v in rebuilt.values()}) == sorted(staged)
    assert report.get("failures", []) == [] and report.get("orphan_device_mounts", []) == []


def _check_down(flags: list[str], base: Path, glusterfs: GlusterServer) -> None:
    """``down`` of every pod leaves nothing mounted and no client running; data stays."""
    down = _kubevol("down", *flags, "--timeout", "60s",
                    *(f"--pod-uid={uid}" for uid in CRASH_UIDS.values()))
    assert down.returncode == 0, down.stdout + down.stderr
    assert mounts_under(base / "kubelet") == []
    assert wait_for(lambda: not gluster_clients_under(base))
    for pv in ("pv-a", "pv-b"):
        assert (glusterfs.brick / "crash" / pv / "from-p3").read_text() == pv


def test_kill_9_mid_way_then_reconstruct_rebuilds_and_teardown_leaves_nothing(
    tmp_path: Path, glusterfs: GlusterServer
) -> None:
    """``kubevol up`` is killed with SIGKILL while the driver is publishing pv-b to the
    third pod (pv-a and pv-b are both staged by then). ``kubevol reconstruct`` rebuilds both
    volumes and their global mounts from disk, and reports no failure and no orphan; ``up``
    completes the pods; ``down`` of every pod unstages both volumes and leaves nothing
    mounted and no GlusterFS client running; the pods' data stays on the brick."""
    base = tmp_path / "node"
    root = base / "kubelet"
    root.mkdir(parents=True)
    sock = base / "sfs.sock"
    gate = base / "publish-gate"
    config = SharedFSConfig(state_dir=str(base / "state"), node_id="node-1",
                            source=glusterfs.source, fstype="glusterfs", timeout=5)
    driver = SharedFSDriver(config)
    node: Any = driver.plugin.node
    real_publish = node.node_publish_volume

    def gated_publish(request: Any, context: Any) -> Any:
        response = real_publish(request, context)
        if gate.exists() and CRASH_UIDS["p3"] in request.target_path and (
            request.volume_id == handles["pv-b"]
        ):
            (base / "publish-gate.entered").write_text(request.target_path)
            while gate.exists():
                time.sleep(0.01)
        return response

    node.node_publish_volume = gated_publish
    running = driver.serve(f"unix://{sock}")
    up: subprocess.Popen[str] | None = None
    handles: dict[str, str] = {}
    flags = ["--root", str(root), "--node-name", "node-1"]
    try:
        contexts = {}
        with CSIClient(running.endpoint, timeout=30) as client:
            for pv in ("pv-a", "pv-b"):
                vol = client.create_volume(f"pvc-{pv}", [MULTI],
                                           parameters={"subDir": f"crash/{pv}"})
                handles[pv] = vol.volume_id
                contexts[pv] = (vol.volume_id, dict(vol.volume_context))
        manifest = _crash_manifest(tmp_path, contexts)
        gate.write_text("hold")
        up = subprocess.Popen(
            [sys.executable, "-m", "kubevol.cli.main", "up", *flags, "--csi-driver",
             f"{DRIVER_NAME}={running.endpoint}", "--guard-policy", "safe", str(manifest)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert wait_for((base / "publish-gate.entered").exists, 60), "up never reached p3"
        up.kill()
        up.wait(30)
        gate.unlink()
        _check_reconstruction(flags, root)

        again = _kubevol("up", *flags, "--csi-driver", f"{DRIVER_NAME}={running.endpoint}")
        assert again.returncode == 0, again.stderr
        p3 = root / "pods" / CRASH_UIDS["p3"] / "volumes" / "kubernetes.io~csi"
        for pv in ("pv-a", "pv-b"):
            Path(p3, pv, "mount", "from-p3").write_text(pv)
        _check_down(flags, base, glusterfs)
    finally:
        if up is not None and up.poll() is None:
            up.kill()
            up.wait()
        gate.unlink(missing_ok=True)
        running.stop(grace=2)
        unmount_all_under(base)
