"""Covers kubevol.node.mountcheck.

Which mounts belong to which pod, read from the mount table.
"""

from __future__ import annotations

from pathlib import Path

from kubevol.mount.table import MountTable
from kubevol.node.mountcheck import mounts_by_pod, pod_mounts


def test_mounts_by_pod_finds_each_pods_mounts_in_one_pass(tmp_path: Path) -> None:
    """A pod's volume and subPath mounts, its CSI block publish path and its bind under a
    block volume's global map path are its own; a device mount and a mount outside the
    root belong to no pod; pod_mounts answers the same, pod by pod."""
    root = str(tmp_path.resolve())
    points = {
        "a-volume": f"{root}/pods/uid-a/volumes/kubernetes.io~csi/pv-a/mount",
        "a-subpath": f"{root}/pods/uid-a/volume-subpaths/pv-a/c/0",
        "b-publish": f"{root}/plugins/kubernetes.io/csi/volumeDevices/publish/pv-b/uid-b",
        "b-map": f"{root}/plugins/kubernetes.io/csi/volumeDevices/pv-b/dev/uid-b",
        "device": f"{root}/plugins/kubernetes.io/csi/hp.example/0123abcd/globalmount",
        "outside": "/elsewhere/pods/uid-a/volumes/kubernetes.io~csi/pv-a/mount",
    }
    lines = [
        f"{40 + i} 1 0:30 / {point} rw,relatime - tmpfs tmpfs rw\n"
        for i, point in enumerate(points.values())
    ]
    table = MountTable("".join(lines).encode())
    by_pod = mounts_by_pod(root, table)
    assert by_pod == {
        "uid-a": [points["a-volume"], points["a-subpath"]],
        "uid-b": [points["b-publish"], points["b-map"]],
    }
    for uid, found in by_pod.items():
        assert pod_mounts(root, uid, table) == found
    assert pod_mounts(root, "uid-c", table) == []
