"""Covers kubevol.node.operations' expansion and kubevol.plugins.csi.expander.

A grown claim is expanded on the node, by ``kubevol up`` (the one-shot form of the
agent's reconcile pass) and by the agent, for filesystem and block volumes: the bundled
hostpath driver over gRPC sees NodeExpandVolume with the kubelet's arguments, and the
volume or the loop device then has the new size.

The kubelet's facts compared with (``pkg/volume/csi/expander.go``): ``volume_path`` is the
pod's mount path for a filesystem volume and the device path (what MapPodDevice published)
for a block volume, whose fsType is ``block``; ``staging_target_path`` is the staging path;
``capacity_range.required_bytes`` is the PersistentVolume's new capacity; the access mode is
the PV's first one, mapped as for NodeStage and NodePublish.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.cli.main import main
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.layout import sha256_hex
from kubevol.node.agent import Agent
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.node.hostpath_calls import MiB, RecordedHostPath, device_size, recorded_hostpath
from tests.node.test_agent import UIDS, AgentThreads, pod, pv, write_atomically

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

EXPAND = "node_expand_volume"
#: ReadWriteOnce as the kubelet sends it to a driver with the SINGLE_NODE_MULTI_WRITER node
#: capability, which the hostpath driver has (csi_client.go's getNodeV1AccessModeMapper).
RWO = csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER
CSI_DIR = "plugins/kubernetes.io/csi"


@pytest.fixture
def hostpath(tmp_path: Path) -> Iterator[RecordedHostPath]:
    """The hostpath driver on a tmpfs of its own, NodeExpandVolume recorded."""
    if os.geteuid() != 0:
        pytest.fail("the expansion tests need root (real mounts, loop devices)")
    with recorded_hostpath(tmp_path, (EXPAND,)) as driver:
        yield driver


def sized(text: str, size: str) -> str:
    """``text`` (from :func:`pv`) with the PersistentVolume's capacity set to ``size``."""
    assert "capacity: {storage: 16Mi}" in text
    return text.replace("capacity: {storage: 16Mi}", f"capacity: {{storage: {size}}}")


def web_manifest(handle: str, size: str) -> str:
    return sized(pv("pv-web", handle), size) + pod(
        "web", "  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}\n")


def raw_manifest(handle: str, size: str) -> str:
    return sized(pv("pv-raw", handle, block=True), size) + pod(
        "raw", "  - {name: disk, persistentVolumeClaim: {claimName: pv-raw-claim}}\n",
        "[{name: c, image: x, volumeDevices: [{name: disk, devicePath: /dev/xvda}]}]")


def up(tmp_path: Path, driver: RecordedHostPath, manifest: Path) -> int:
    return main(["up", "--root", str(tmp_path / "root"), "--node-name", "n1",
                 "--csi-driver", f"{DRIVER_NAME}={driver.endpoint}", str(manifest)])


def raw_link(root: Path) -> str:
    return f"{root}/pods/{UIDS['raw']}/volumeDevices/kubernetes.io~csi/pv-raw"


def assert_block_request(request: Any, root: Path, handle: str) -> None:
    """The kubelet's NodeExpandVolume for a block volume."""
    assert request.volume_id == handle
    # The device path: what MapPodDevice published (volumeDevices/publish/<pv>/<pod>).
    assert request.volume_path == f"{root}/{CSI_DIR}/volumeDevices/publish/pv-raw/{UIDS['raw']}"
    assert request.staging_target_path == f"{root}/{CSI_DIR}/volumeDevices/staging/pv-raw"
    assert request.capacity_range.required_bytes == 32 * MiB
    assert request.volume_capability.WhichOneof("access_type") == "block"
    assert request.volume_capability.access_mode.mode == RWO


def test_up_expands_a_grown_filesystem_claim(
    tmp_path: Path, hostpath: RecordedHostPath, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` again with a PersistentVolume grown in the manifest calls NodeExpandVolume once,
    with the pod's mount path and the staging path; the volume then reports the new size,
    and a further `up` expands nothing (the node's size is remembered under the root)."""
    root = tmp_path / "root"
    handle = hostpath.create_volume("web-data", 16 * MiB)
    manifest = tmp_path / "web.yaml"
    manifest.write_text(web_manifest(handle, "16Mi"))
    assert up(tmp_path, hostpath, manifest) == 0
    mount = f"{root}/pods/{UIDS['web']}/volumes/kubernetes.io~csi/pv-web/mount"
    assert mount in mounts_under(root)
    assert hostpath.calls(EXPAND) == []

    hostpath.controller_expand(handle, 32 * MiB)
    manifest.write_text(web_manifest(handle, "32Mi"))
    assert up(tmp_path, hostpath, manifest) == 0
    (request,) = hostpath.calls(EXPAND)
    assert request.volume_id == handle
    assert request.volume_path == mount
    assert request.staging_target_path == (
        f"{root}/{CSI_DIR}/{DRIVER_NAME}/{sha256_hex(handle)}/globalmount"
    )
    assert request.capacity_range.required_bytes == 32 * MiB
    assert request.volume_capability.WhichOneof("access_type") == "mount"
    assert request.volume_capability.mount.fs_type == ""  # the PV names none
    assert request.volume_capability.access_mode.mode == RWO
    capsys.readouterr()
    assert main(["csi", "node", "stats", "-e", hostpath.endpoint, "-o", "json",
                 f"{handle}:{mount}"]) == 0
    assert '"total": 33554432' in capsys.readouterr().out

    assert up(tmp_path, hostpath, manifest) == 0
    assert len(hostpath.calls(EXPAND)) == 1


def test_up_expands_a_grown_block_claim(
    tmp_path: Path, hostpath: RecordedHostPath
) -> None:
    """`up` again with a block PersistentVolume grown in the manifest calls NodeExpandVolume
    with the device path and fsType block (the reconciler's block branch reaches the size
    check); the pod's device then has the new size, which without it it has not."""
    root = tmp_path / "root"
    handle = hostpath.create_volume("raw-disk", 16 * MiB, block=True)
    manifest = tmp_path / "raw.yaml"
    manifest.write_text(raw_manifest(handle, "16Mi"))
    assert up(tmp_path, hostpath, manifest) == 0
    assert device_size(raw_link(root)) == 16 * MiB

    hostpath.controller_expand(handle, 32 * MiB)
    assert device_size(raw_link(root)) == 16 * MiB  # the loop device waits for the node
    manifest.write_text(raw_manifest(handle, "32Mi"))
    assert up(tmp_path, hostpath, manifest) == 0
    (request,) = hostpath.calls(EXPAND)
    assert_block_request(request, root, handle)
    assert device_size(raw_link(root)) == 32 * MiB


def claim_status(text: str, size: str) -> str:
    """``text`` (from :func:`pv`) with the claim's ``status.capacity`` set to ``size``."""
    assert text.count("kind: PersistentVolumeClaim\n") == 1
    return text.replace("kind: PersistentVolumeClaim\n",
                        f"kind: PersistentVolumeClaim\nstatus: {{capacity: {{storage: {size}}}}}\n")


@pytest.mark.parametrize("status", ["16Mi", None])
def test_up_expands_a_claim_grown_while_no_pod_used_it(
    tmp_path: Path, hostpath: RecordedHostPath, capsys: pytest.CaptureFixture[str],
    status: str | None,
) -> None:
    """Offline expansion (volume_expand.go, "Verify if offline PVC expansion works"): the
    volume was grown by the controller while no pod used it, so the PersistentVolume asks
    32Mi and the claim's status still reports 16Mi. The first `up` expands it on the node
    (the kubelet's InitializeClaimSize takes the size from the claim's status), and the
    filesystem has the new size. Without a status (the counter-check) the node cannot know
    and does not expand."""
    root = tmp_path / "root"
    handle = hostpath.create_volume("web-data", 16 * MiB)
    hostpath.controller_expand(handle, 32 * MiB)
    manifest = tmp_path / "web.yaml"
    text = web_manifest(handle, "32Mi")
    manifest.write_text(claim_status(text, status) if status else text)
    assert up(tmp_path, hostpath, manifest) == 0
    mount = f"{root}/pods/{UIDS['web']}/volumes/kubernetes.io~csi/pv-web/mount"
    capsys.readouterr()
    assert main(["csi", "node", "stats", "-e", hostpath.endpoint, "-o", "json",
                 f"{handle}:{mount}"]) == 0
    stats = capsys.readouterr().out
    if status is None:
        assert hostpath.calls(EXPAND) == []
        return
    (request,) = hostpath.calls(EXPAND)
    assert request.volume_path == mount
    assert request.capacity_range.required_bytes == 32 * MiB
    assert '"total": 33554432' in stats
    assert up(tmp_path, hostpath, manifest) == 0
    assert len(hostpath.calls(EXPAND)) == 1


@pytest.fixture
def run_agent(tmp_path: Path, hostpath: RecordedHostPath) -> Iterator[Callable[[], Agent]]:
    threads = AgentThreads()
    (tmp_path / "manifests").mkdir()

    def start() -> Agent:
        runtime = NodeRuntime(str(tmp_path / "root"), node_name="n1",
                              csi_drivers={DRIVER_NAME: hostpath.endpoint})
        agent = Agent(runtime, manifest_dir=str(tmp_path / "manifests"))
        threads.run(agent, runtime)
        return agent

    yield start
    threads.stop_all()


def test_agent_expands_a_grown_block_claim(
    tmp_path: Path, hostpath: RecordedHostPath, run_agent: Callable[[], Agent]
) -> None:
    """The agent's loop expands a block claim grown in its manifest directory, as it does a
    filesystem claim, with the kubelet's block arguments."""
    root = tmp_path / "root"
    handle = hostpath.create_volume("raw-disk", 16 * MiB, block=True)
    manifest = tmp_path / "manifests" / "raw.yaml"
    run_agent()
    manifest.write_text(raw_manifest(handle, "16Mi"))
    wait_until(lambda: os.path.lexists(raw_link(root)), 30, "the block device link")
    hostpath.controller_expand(handle, 32 * MiB)
    write_atomically(manifest, raw_manifest(handle, "32Mi"))
    wait_until(lambda: hostpath.calls(EXPAND), 30, "NodeExpandVolume")
    (request,) = hostpath.calls(EXPAND)
    assert_block_request(request, root, handle)
    wait_until(lambda: device_size(raw_link(root)) == 32 * MiB, 30, "the device grown")


def test_up_is_not_done_while_the_driver_refuses_the_expansion(
    tmp_path: Path, hostpath: RecordedHostPath, capsys: pytest.CaptureFixture[str]
) -> None:
    """A claim grown past what the controller expanded: the driver refuses NodeExpandVolume
    (OUT_OF_RANGE), `up` exits 1 saying so and the size stays unexpanded on the node, so
    that `up` once the controller expanded it expands it."""
    root = tmp_path / "root"
    handle = hostpath.create_volume("raw-disk", 16 * MiB, block=True)
    manifest = tmp_path / "raw.yaml"
    manifest.write_text(raw_manifest(handle, "16Mi"))
    assert up(tmp_path, hostpath, manifest) == 0
    manifest.write_text(raw_manifest(handle, "32Mi"))
    capsys.readouterr()
    assert up(tmp_path, hostpath, manifest) == 1
    assert "OUT_OF_RANGE" in capsys.readouterr().err
    assert hostpath.calls(EXPAND)
    assert device_size(raw_link(root)) == 16 * MiB

    hostpath.controller_expand(handle, 32 * MiB)
    assert up(tmp_path, hostpath, manifest) == 0
    assert_block_request(hostpath.calls(EXPAND)[-1], root, handle)
    assert device_size(raw_link(root)) == 32 * MiB


def test_up_does_not_expand_a_read_only_claim(
    tmp_path: Path, hostpath: RecordedHostPath
) -> None:
    """A claim the pod mounts read-only is not expanded however it grows (the kubelet's
    volumeNeedsExpansion skips read-only volumes), and `up` is done."""
    handle = hostpath.create_volume("web-data", 16 * MiB)
    manifest = tmp_path / "web.yaml"

    def read_only(size: str) -> str:
        return sized(pv("pv-web", handle), size) + pod(
            "web",
            "  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim, readOnly: true}}\n",
        )

    manifest.write_text(read_only("16Mi"))
    assert up(tmp_path, hostpath, manifest) == 0
    hostpath.controller_expand(handle, 32 * MiB)
    manifest.write_text(read_only("32Mi"))
    assert up(tmp_path, hostpath, manifest) == 0
    assert hostpath.calls(EXPAND) == []
