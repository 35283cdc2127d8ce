"""Fixtures for the node volume manager tests: a kubelet root under tmp_path with the
built-in plugins and the fake staged plugin, and a safety net that unmounts whatever a
failing test left under tmp_path (tests assert on leaks themselves)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from kubevol.manager import VolumePluginMgr
from kubevol.node.host import NodeVolumeHost, node_plugins
from kubevol.plugin import VolumePlugin
from kubevol.plugins import LocalVolumePlugin
from kubevol.testing.mount_rig import unmount_all_under
from tests.node.fakes import StagedPlugin


def plugins_beside_the_fake() -> list[VolumePlugin]:
    """A node's plugins except the local-volume one: the fake plugin serves the same
    ``local.path`` PersistentVolumes."""
    return [p for p in node_plugins() if not isinstance(p, LocalVolumePlugin)]


@attrs.define
class NodeEnv:
    """A node root with its host, plugin manager and the fake staged plugin."""

    tmp: Path
    root: Path
    host: NodeVolumeHost
    mgr: VolumePluginMgr
    staged: StagedPlugin

    def source(self, name: str) -> Path:
        """A directory standing for a volume's backing storage."""
        path = self.tmp / "sources" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def fresh_mgr(self) -> tuple[VolumePluginMgr, StagedPlugin]:
        """A new plugin manager over the same root (what a restarted agent builds)."""
        staged = StagedPlugin()
        mgr = VolumePluginMgr()
        mgr.init_plugins([*plugins_beside_the_fake(), staged], host=self.host)
        return mgr, staged


@pytest.fixture
def env(tmp_path: Path) -> Iterator[NodeEnv]:
    """A node environment; anything left mounted under tmp_path is unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the node tests need root (run them as scripts/run-tests.sh does)")
    root = tmp_path / "kubelet"
    root.mkdir()
    host = NodeVolumeHost(root_dir=str(root), node_name="node-1")
    staged = StagedPlugin()
    mgr = VolumePluginMgr()
    mgr.init_plugins([*plugins_beside_the_fake(), staged], host=host)
    try:
        yield NodeEnv(tmp=tmp_path, root=root, host=host, mgr=mgr, staged=staged)
    finally:
        unmount_all_under(tmp_path)
