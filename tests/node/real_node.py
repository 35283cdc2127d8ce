"""The real-node kubelet root (:mod:`kubevol.testing.kubelet_root`) as a context for tests:
built under the test's directory on real mounts, every mount and the loop device undone
after, even when the test failed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from kubevol.testing.kubelet_root import KubeletRoot, build_kubelet_root
from kubevol.testing.mount_rig import MountRig


@contextlib.contextmanager
def real_node(base: Path, *, pods: int = 3) -> Iterator[KubeletRoot]:
    """A real-node root at ``base/root``; the rig's mounts (and what else was mounted under
    ``base`` meanwhile) are undone afterwards."""
    rig = MountRig(base)
    try:
        yield build_kubelet_root(rig, base / "root", pods=pods)
    finally:
        rig.cleanup()
