"""Fixtures shared by every test directory: kubelet roots and real-mount rigs, and the test
CSI driver served on a real unix socket (in-process or as a process) with clients for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.csidriver.server import StoragePlugin, serve_in_background
from kubevol.node.host import NodeVolumeHost
from kubevol.testing.csi_driver import FakeCSIDriver
from kubevol.testing.glusterfs import GlusterServer, missing_programs
from kubevol.testing.kubelet_root import KubeletRoot, build_kubelet_root
from kubevol.testing.mount_rig import KubeletTree, MountRig, unmount_all_under
from tests.csi.support import (
    HostPathServer,
    ProcessFactory,
    Served,
    ServeFactory,
    wait_for_socket,
)

# As kubevol.csi does (imported above, through the node host), before any test module
# imports grpc: the tests fork+exec commands while gRPC channels live, and gRPC's fork
# handlers can deadlock inside fork().
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

#: Fixtures that mount (or start servers that do): a test using one needs root.
ROOT_FIXTURES = frozenset({"rig", "real_node", "glusterfs", "env", "serve_hostpath"})
#: Fixtures that start a real etcd server.
ETCD_FIXTURES = frozenset({"etcd_server", "etcd", "auth_etcd"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers by what a test needs (tests/README.md): ``root`` and ``etcd`` from the fixtures
    it uses, on top of the markers written in the test files; ``slow`` is written there.
    ``-m "not root and not etcd and not slow"`` is the logic tier: no root, seconds."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & ROOT_FIXTURES:
            item.add_marker(pytest.mark.root)
        if used & ETCD_FIXTURES:
            item.add_marker(pytest.mark.etcd)


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """An empty kubelet-style root directory."""
    root = tmp_path / "kubelet"
    root.mkdir()
    return root


@pytest.fixture
def host(node_root: Path) -> NodeVolumeHost:
    """A NodeVolumeHost on ``node_root`` for node ``node-1`` with the real Linux mounter."""
    return NodeVolumeHost(root_dir=str(node_root), node_name="node-1")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[MountRig]:
    """Real mounts under tmp_path (loop devices, tmpfs, binds, a dead FUSE mount), all undone
    afterwards. Needs root, in a private mount namespace (as scripts/run-tests.sh runs)."""
    if os.geteuid() != 0:
        pytest.fail("these tests mount filesystems: run them as root (scripts/run-tests.sh)")
    r = MountRig(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture
def kubelet(node_root: Path) -> KubeletTree:
    """An empty kubelet root (``node_root``) to stage and publish volumes in."""
    return KubeletTree(node_root)


@pytest.fixture
def real_node(rig: MountRig, tmp_path: Path) -> KubeletRoot:
    """A kubelet root shaped as a real node has it (3 pods,
    :mod:`kubevol.testing.kubelet_root`, built from the kubelet's facts) at tmp_path/root, on
    the rig's real mounts, all undone afterwards."""
    return build_kubelet_root(rig, tmp_path / "root", pods=3)


@pytest.fixture
def serve_hostpath(tmp_path: Path) -> Iterator[HostPathServer]:
    """The one in-process bundled hostpath driver of the tests (state under
    ``tmp_path/hp``, a unix socket of its own). Afterwards the driver is stopped and
    everything mounted under tmp_path (the driver's volumes, the tests' roots) unmounted.
    Needs root."""
    if os.geteuid() != 0:
        pytest.fail("the hostpath driver mounts: run these tests as root (scripts/run-tests.sh)")
    served: list[RunningDriver] = []

    def serve(node_id: str = "n1") -> RunningDriver:
        config = HostPathConfig(state_dir=str(tmp_path / "hp"), node_id=node_id)
        served.append(HostPathDriver(config).serve())
        return served[-1]

    try:
        yield serve
    finally:
        for running in served:
            running.stop(grace=2)
        unmount_all_under(tmp_path)


@pytest.fixture
def serve_driver(tmp_path: Path) -> Iterator[ServeFactory]:
    """Serve the test driver (or a given plugin) with an env; stops everything afterwards."""
    started: list[Served] = []

    def start(
        env: Mapping[str, str] | None = None,
        *,
        plugin: StoragePlugin | None = None,
        driver: FakeCSIDriver | None = None,
        socket_name: str = "csi.sock",
        **kwargs: Any,
    ) -> Served:
        driver = driver or FakeCSIDriver()
        if plugin is None:
            plugin = driver.plugin()
        endpoint = f"unix://{tmp_path / socket_name}"
        handle = serve_in_background(plugin, endpoint, env=dict(env or {}), **kwargs)
        served = Served(handle, driver, CSIClient(handle.address, timeout=20))
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        served.client.close()
        served.handle.stop(grace=1)


@pytest.fixture
def served(serve_driver: ServeFactory) -> Served:
    """The test driver with no middleware switched on."""
    return serve_driver()


@pytest.fixture
def driver_process(tmp_path: Path) -> Iterator[ProcessFactory]:
    """Start the test driver as a separate process (``python -m kubevol.testing.csi_driver``
    with ``args``, its server configured by ``env``); killed by PID afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        socket_path: Path, env: Mapping[str, str], *args: str
    ) -> subprocess.Popen[bytes]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("X_CSI", "CSI_"))}
        full_env.update(env)
        full_env["CSI_ENDPOINT"] = f"unix://{socket_path}"
        command = [sys.executable, "-m", "kubevol.testing.csi_driver", *args]
        with open(tmp_path / f"{socket_path.name}.log", "ab") as log:
            proc = subprocess.Popen(command, env=full_env, stdout=log, stderr=log)
        procs.append(proc)
        wait_for_socket(socket_path, proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def glusterfs(tmp_path: Path) -> Iterator[GlusterServer]:
    """A real GlusterFS server of the test's own (:mod:`kubevol.testing.glusterfs`: a private
    glusterd, one volume on loopback) mounted at ``tmp_path/glusterfs/mnt``
    (``glusterfs.mount_point``); all undone afterwards, frozen or not. Fails, never skips,
    without root or without GlusterFS installed."""
    if os.geteuid() != 0:
        pytest.fail("GlusterFS tests mount filesystems: run them as root (scripts/run-tests.sh)")
    missing = missing_programs()
    if missing:
        pytest.fail(
            f"GlusterFS is not installed (no {', '.join(missing)}): "
            "run scripts/install-system-deps.sh as root"
        )
    server = GlusterServer(tmp_path / "glusterfs")
    try:
        server.start()
        server.mount(server.base_dir / "mnt")
        yield server
    finally:
        server.cleanup()
