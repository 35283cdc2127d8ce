"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.node.host import NodeVolumeHost
from kubevol.testing.kubelet_root import KubeletRoot, build_kubelet_root
from kubevol.testing.mount_rig import KubeletTree, MountRig

# As kubevol.csi does (imported above, through the node host), before any test module
# imports grpc: the tests fork+exec commands while gRPC channels live, and gRPC's fork
# handlers can deadlock inside fork().
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


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
