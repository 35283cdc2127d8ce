"""Fixtures for the mount tests: real mounts (kubevol.testing.mount_rig) and a kubelet tree.

Run the tests as root in a private mount namespace (``unshare -m --propagation private``),
as scripts/run-tests.sh does; every mount, loop device and process is undone afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.testing.mount_rig import KubeletTree, MountRig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[MountRig]:
    """A MountRig under the test's tmp_path; everything it made is undone afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the mount tests need root (run them as scripts/run-tests.sh does)")
    r = MountRig(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture
def kubelet(tmp_path: Path) -> KubeletTree:
    """An empty kubelet root under tmp_path."""
    root = tmp_path / "kubelet"
    root.mkdir()
    return KubeletTree(root)
