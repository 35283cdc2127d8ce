"""Fixtures shared by every test directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubevol.node.host import NodeVolumeHost


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
