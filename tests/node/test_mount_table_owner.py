"""Covers kubevol.mount.interface's table as the one table kubevol.node reads.

The node's mount table has one owner, the host's mounter
(:meth:`kubevol.mount.interface.MountInterface.table`): the volume-users check, the
unstage path, reconstruction and orphan detection all ask it instead of reading and
caching tables of their own."""

from __future__ import annotations

from pathlib import Path

from kubevol.manager import VolumePluginMgr
from kubevol.mount import LinuxMounter
from kubevol.mount.table import MountTable
from kubevol.node.host import NodeVolumeHost
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.orphans import find_orphan_device_mounts
from kubevol.node.reconstruct import scan
from kubevol.plugins import builtin_plugins


class AskedMounter(LinuxMounter):
    """The real mounter, noting every time its table is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[bool, str | None]] = []

    def table(self, *, superset: bool = False, at: str | None = None) -> MountTable:
        self.asked.append((superset, at))
        return super().table(superset=superset, at=at)


def node(tmp_path: Path) -> tuple[NodeVolumeHost, VolumePluginMgr, AskedMounter]:
    mounter = AskedMounter()
    host = NodeVolumeHost(root_dir=str(tmp_path / "root"), node_name="n1", mounter=mounter)
    mgr = VolumePluginMgr()
    mgr.init_plugins(builtin_plugins(), host=host)
    return host, mgr, mounter


def test_reconstruction_and_orphan_detection_read_the_hosts_table(tmp_path: Path) -> None:
    host, mgr, mounter = node(tmp_path)
    scan(host, mgr)
    assert mounter.asked == [(False, None)]  # one table for the scan and its orphans
    find_orphan_device_mounts(host, mgr)
    assert mounter.asked == [(False, None), (False, None)]


def test_the_volume_users_check_reads_the_hosts_table(tmp_path: Path) -> None:
    host, mgr, mounter = node(tmp_path)
    manager = NodeVolumeManager(host, mgr, workers=0)
    try:
        table = manager.usage.table(superset=True, at="/x")
        assert mounter.asked == [(True, "/x")]
        # The one cache: the manager's question and the mounter's own share a reading.
        assert mounter.table(superset=True, at="/x") is table
        manager.reconstruct(clean=False)
        assert len(mounter.asked) == 3
    finally:
        manager.close()
