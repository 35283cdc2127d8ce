"""Covers kubevol.node.reconstruct on a real node's root.

Reconstruction on a kubelet root shaped as a real node has it (built from the kubelet's
code, not kubevol's writers: :mod:`kubevol.testing.kubelet_root`)."""

from __future__ import annotations

import json
import os

import pytest

from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.node.reconstruct import scan
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.kubelet_root import (
    EPHEMERAL_DRIVER,
    PV_DRIVER,
    KubeletRoot,
    attachment_id,
    inline_volume_handle,
    sha256_hex,
)
from kubevol.testing.mount_rig import mounts_under

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


def test_the_fixture_has_a_real_nodes_shape(real_node: KubeletRoot) -> None:
    """Every pod has a kube-api-access projected tmpfs and the atomic writer's layout;
    wrapped emptyDir ready markers; both PVs staged from one loop device; the vol_data.json
    files carry the kubelet's keys; the non-pod files exist."""
    root = real_node.root
    mounts = {e.mount_point: e for e in parse_mountinfo()}
    for uid in real_node.pods:
        [token] = [v for v in real_node.volumes_of(uid) if v.name.startswith("kube-api-access-")]
        assert mounts[str(token.path)].fs_type == "tmpfs"
        data = os.readlink(token.path / "..data")
        assert data.startswith("..") and os.path.isdir(token.path / data)
        assert os.readlink(token.path / "token") == "..data/token"
        ready = root / "pods" / uid / "plugins/kubernetes.io~empty-dir" / f"wrapped_{token.name}"
        assert (ready / "ready").is_file()
        inline = json.loads((root / "pods" / uid / "volumes/kubernetes.io~csi/secrets-store"
                             / "vol_data.json").read_text())
        handle = inline_volume_handle(uid, "secrets-store")
        assert inline == {
            "specVolID": "secrets-store", "volumeHandle": handle,
            "driverName": EPHEMERAL_DRIVER, "nodeName": real_node.node_name,
            "attachmentID": attachment_id(handle, EPHEMERAL_DRIVER, real_node.node_name),
            "volumeLifecycleMode": "Ephemeral",
        }
    sources = {mounts[str(p)].source for p in real_node.staging.values()}
    assert len(sources) == 1 and next(iter(sources)).startswith("/dev/loop")
    logs_dir = real_node.staging["pv-logs"].parent
    assert logs_dir.name == sha256_hex("vol-4e5f6a7b") and logs_dir.parent.name == PV_DRIVER
    assert set(json.loads((logs_dir / "vol_data.json").read_text())) == {
        "volumeHandle", "driverName", "seLinuxMountContext"}
    assert all(os.path.lexists(p) for p in real_node.non_pod_paths)
    assert len(real_node.subpaths) == len(real_node.pods) + 1


def test_scan_rebuilds_every_volume_of_a_known_kind(real_node: KubeletRoot) -> None:
    """The kinds kubevol has plugins for (projected, configMap, secret, downwardAPI,
    emptyDir, CSI PVs, inline CSI ephemeral volumes — with no driver registered — and local
    PVs) come back mounted as they are, with their subPath binds; volumes of plugins kubevol
    does not have are listed apart, not as failures; the scan changes no mount."""
    before = mounts_under(real_node.root)
    with NodeRuntime(
        str(real_node.root), node_name=real_node.node_name, entry_points=False
    ) as runtime:
        assert not runtime.registry.drivers()
        result = scan(runtime.host, runtime.mgr)
    found = {(f.dir.pod_uid, f.dir.plugin_name, f.dir.spec_name): f for f in result.volumes}
    assert result.failures == ()
    assert {(u.dir.pod_uid, u.dir.plugin_name, u.dir.spec_name) for u in result.unknown} == {
        (v.pod_uid, v.plugin, v.name) for v in real_node.volumes if v.unknown}
    assert len(found) == len(real_node.known)
    for v in real_node.known:
        f = found[(v.pod_uid, v.plugin, v.name)]
        assert (f.mount.value == "mounted") == v.mounted, (v, f.mount)
    for bind in real_node.subpaths:
        [f] = [f for k, f in found.items() if k[0] == bind.pod_uid and k[2] == bind.volume]
        assert str(bind.path) in f.subpaths
    assert not result.orphans
    assert mounts_under(real_node.root) == before
