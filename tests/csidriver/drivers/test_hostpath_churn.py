"""Covers kubevol.csidriver.drivers.hostpath.

The hostpath driver while other mounts on the node come and go: every RPC succeeds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.mount import syscalls
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.testing.mount_churn import MountChurn
from kubevol.testing.mount_rig import mounts_under
from tests.csidriver.drivers.conftest import Served, target_path

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

MOUNT = t.VolumeCapability.mount()
#: Mounts that stay for the whole test, so the table spans many read(2) calls.
STABLE = 150


@pytest.fixture
def busy_node(tmp_path: Path) -> Iterator[None]:
    """``STABLE`` tmpfs mounts under ``tmp_path/stable`` for the whole test (ask for it after
    the driver fixture, so they are gone before that checks for leftovers)."""
    points = []
    try:
        for i in range(STABLE):
            point = tmp_path / "stable" / str(i)
            point.mkdir(parents=True)
            syscalls.mount("stable", str(point), "tmpfs", 0, "size=64k")
            points.append(str(point))
        yield
    finally:
        for mounted in reversed(points):
            syscalls.umount(mounted, syscalls.MNT_DETACH)


def test_lifecycles_succeed_while_other_mounts_churn(
    hostpath: Served, busy_node: None, tmp_path: Path
) -> None:
    """Create, stage, publish, unpublish, unstage and delete, 25 times, while a thread
    mounts and unmounts tmpfs thousands of times a second: no RPC fails, nothing of the
    driver's stays mounted."""
    c = hostpath.client
    with MountChurn(tmp_path / "churn") as churn:
        for i in range(25):
            vol = c.create_volume(f"churn-{i}", [MOUNT])
            staging = tmp_path / "plugins" / f"s{i}"
            staging.mkdir(parents=True)
            c.node_stage_volume(vol.volume_id, str(staging), MOUNT)
            target = target_path(tmp_path, f"pod{i}")
            c.node_publish_volume(vol.volume_id, target, MOUNT, staging_target_path=str(staging))
            assert any(e.mount_point == target for e in parse_mountinfo())
            c.node_unpublish_volume(vol.volume_id, target)
            c.node_unstage_volume(vol.volume_id, str(staging))
            c.delete_volume(vol.volume_id)
        assert churn.cycles > 0  # the churn overlapped the lifecycles
    driver_dirs = (tmp_path / "plugins", tmp_path / "pods", tmp_path / "state")
    assert [m for d in driver_dirs for m in mounts_under(d)] == []
