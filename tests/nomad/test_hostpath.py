"""Covers kubevol.nomad with kubevol.csidriver.drivers.hostpath as a process.

The manager with kubevol's bundled hostpath driver, run as a separate process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.nomad import (
    AccessMode,
    CheckMethod,
    CSIManager,
    CSIVolume,
    PluginRegistry,
    PluginType,
    RegisteredPlugin,
    UsageOptions,
    VolumeChecker,
)
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

SCRIPT = Path(__file__).with_name("hostpath_process.py")


@pytest.fixture
def hostpath(tmp_path: Path, sock_dir: Path) -> Iterator[str]:
    """The hostpath driver serving on a socket; its socket path. Stopped afterwards."""
    socket_path = str(sock_dir / "hostpath.sock")
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(tmp_path / "hostpath-state"), socket_path]
    )
    try:
        wait_until(lambda: Path(socket_path).exists() or proc.poll() is not None, 20)
        assert proc.poll() is None, "the hostpath driver exited"
        yield socket_path
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_hostpath_volume_shared_by_two_allocations(
    hostpath: str, registry: PluginRegistry, tmp_path: Path
) -> None:
    """A hostpath volume created through the controller is staged once under the manager's
    layout, shared by two allocations (data written by one is read by the other), and
    unstaged after both unmounted it; the checker uses the driver's volume condition."""
    root = tmp_path / "root"
    registry.register(
        RegisteredPlugin(
            type=PluginType.CSI_NODE,
            name="hostpath",
            alloc_id="plugin-alloc",
            socket_path=hostpath,
            mount_root=str(root),
        )
    )
    with CSIClient(hostpath, timeout=20) as client:
        created = client.create_volume(
            "shared-data", [t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_MULTI_WRITER)]
        )
    mgr = CSIManager(registry, fingerprint_interval=0.5, state_dir=str(tmp_path / "state"))
    mgr.run()
    try:
        mounter = mgr.mounter_for_plugin("hostpath", timeout=20)
        volume = CSIVolume(
            id="shared-data", remote_id=created.volume_id, context=created.volume_context
        )
        usage = UsageOptions(access_mode=AccessMode.SINGLE_NODE_MULTI_WRITER)
        first = mounter.mount_volume(volume, "alloc-a", usage)
        second = mounter.mount_volume(volume, "alloc-b", usage)
        Path(first.source, "note").write_text("written by alloc-a")
        assert Path(second.source, "note").read_text() == "written by alloc-a"
        staging = root / "staging" / "default" / "shared-data" / usage.to_fs()
        assert mounter.requires_staging
        assert str(staging) in mounts_under(root)
        (health_a, health_b) = VolumeChecker(mounter).check_all()
        assert health_a.healthy and health_a.method is CheckMethod.VOLUME_CONDITION
        assert health_b.alloc_id == "alloc-b" and health_b.healthy
        mounter.unmount_volume("shared-data", created.volume_id, "alloc-a", usage)
        assert Path(second.source, "note").exists()
        mounter.unmount_volume("shared-data", created.volume_id, "alloc-b", usage)
        assert mounts_under(root) == []
    finally:
        mgr.shutdown()
