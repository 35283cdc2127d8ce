"""Covers kubevol.mount.guard.

The unstage guard on recorded mount tables of Lustre, CephFS and NFS nodes.

The fixtures use ``/var/lib/kubelet``; each test moves them under a temporary kubelet root
and creates the directories and vol_data.json files a kubelet would have written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kubevol.layout import sha256_hex
from kubevol.mount import GuardPolicy, RefKind, UnmountVerdict, check_unmount_device

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "mountinfo"
_POD_VOLUME = re.compile(r"(/pods/[^/ ]+/volumes/kubernetes\.io~csi/([^/ ]+))/mount")
_HANDLES = {
    "pv-lustre-a": ("azurelustre.csi.azure.com", "lustre-a"),
    "pv-lustre-b": ("azurelustre.csi.azure.com", "lustre-b"),
    "static-pv-1": ("cephfs.csi.ceph.com", "static-pv-1"),
    "pv-a": ("nfs.csi.k8s.io", "nfs-server#export#pv-a"),
}


class Node:
    """A fixture moved under a temporary root, with its kubelet directories created."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.root = tmp_path / "kubelet"
        text = (FIXTURES / name).read_text().replace("/var/lib/kubelet", str(self.root))
        self.mountinfo = tmp_path / name
        self.mountinfo.write_text(text)
        for line in text.splitlines():
            point = line.split(" ")[4].replace("\\040", " ")
            if point.startswith(str(self.root)):
                Path(point).mkdir(parents=True, exist_ok=True)
            pod = _POD_VOLUME.search(line)
            if pod:
                driver, handle = _HANDLES[pod.group(2)]
                data = {"driverName": driver, "volumeHandle": handle, "specVolID": pod.group(2)}
                (Path(str(self.root) + pod.group(1)) / "vol_data.json").write_text(
                    json.dumps(data)
                )

    def global_mount(self, driver: str, handle: str) -> str:
        """The global mount path of (driver, handle) in this node's layout."""
        return f"{self.root}/plugins/kubernetes.io/csi/{driver}/{sha256_hex(handle)}/globalmount"

    def check(
        self, path: str, policy: GuardPolicy, *, detach_follows: bool = False
    ) -> UnmountVerdict:
        """The verdict for ``path`` on this node's recorded mount table."""
        return check_unmount_device(
            path,
            root_dir=str(self.root),
            policy=policy,
            detach_follows=detach_follows,
            mountinfo_path=str(self.mountinfo),
        )


def by_kind(verdict: UnmountVerdict) -> list[tuple[RefKind, bool]]:
    """(kind, blocking) of every reference, in order."""
    return [(r.kind, r.blocking) for r in verdict.refs]


def test_lustre_two_volumes_block_each_other_under_kubelet(tmp_path: Path) -> None:
    """Lustre: volume A's unstage is blocked by volume B's staging and pod under the kubelet."""
    node = Node(tmp_path, "lustre.txt")
    path_a = node.global_mount("azurelustre.csi.azure.com", "lustre-a")
    verdict = node.check(path_a, GuardPolicy.KUBELET)
    assert not verdict.allowed
    assert verdict.message.startswith(f'the device mount path "{path_a}" is still mounted by')
    assert by_kind(verdict) == [(RefKind.OTHER_VOLUME, True), (RefKind.OTHER_VOLUME, True)]


def test_lustre_two_volumes_are_independent_under_safe(tmp_path: Path) -> None:
    """Lustre: safe lets volume A unstage while volume B (another sub-directory) is in use."""
    node = Node(tmp_path, "lustre.txt")
    path_a = node.global_mount("azurelustre.csi.azure.com", "lustre-a")
    verdict = node.check(path_a, GuardPolicy.SAFE)
    assert verdict.allowed
    assert by_kind(verdict) == [(RefKind.OTHER_VOLUME, False), (RefKind.OTHER_VOLUME, False)]


def test_lustre_volume_with_its_pod_is_blocked_under_both(tmp_path: Path) -> None:
    """Lustre: volume B, still used by its pod, is blocked under either policy."""
    node = Node(tmp_path, "lustre.txt")
    path_b = node.global_mount("azurelustre.csi.azure.com", "lustre-b")
    for policy in GuardPolicy:
        verdict = node.check(path_b, policy)
        assert not verdict.allowed
        kinds = {r.mount_point.rsplit("/", 3)[-2]: r.kind for r in verdict.refs}
        assert kinds["pv-lustre-b"] is RefKind.SAME_VOLUME


def test_cephfs_sub_directory_pod_is_seen_only_by_safe(tmp_path: Path) -> None:
    """CephFS (#105323): a pod binding a sub-directory of PV 1 blocks PV 1 only under safe;
    PV 2 is blocked by PV 1 under the kubelet and free under safe."""
    node = Node(tmp_path, "cephfs.txt")
    pv1 = node.global_mount("cephfs.csi.ceph.com", "static-pv-1")
    pv2 = node.global_mount("cephfs.csi.ceph.com", "static-pv-2")
    kubelet = node.check(pv1, GuardPolicy.KUBELET)
    assert by_kind(kubelet) == [(RefKind.OTHER_VOLUME, True)]
    safe = node.check(pv1, GuardPolicy.SAFE)
    assert not safe.allowed
    assert by_kind(safe) == [(RefKind.OTHER_VOLUME, False), (RefKind.SAME_VOLUME, True)]
    assert not node.check(pv2, GuardPolicy.KUBELET).allowed
    assert node.check(pv2, GuardPolicy.SAFE).allowed


def test_nfs_foreign_mount_is_a_warning_unless_detach_follows(tmp_path: Path) -> None:
    """NFS: a backup mount of the export outside the root warns under safe, and blocks when
    a detach follows or under the kubelet."""
    node = Node(tmp_path, "nfs.txt")
    pv_b = node.global_mount("nfs.csi.k8s.io", "nfs-server#export#pv-b")
    safe = node.check(pv_b, GuardPolicy.SAFE)
    assert safe.allowed
    assert safe.warnings == (
        f"/mnt/backup: {next(r for r in safe.refs if r.kind is RefKind.FOREIGN).reason}",
    )
    assert not node.check(pv_b, GuardPolicy.SAFE, detach_follows=True).allowed
    assert not node.check(pv_b, GuardPolicy.KUBELET).allowed


@pytest.mark.parametrize("policy", list(GuardPolicy))
def test_nfs_volume_with_its_pod_is_blocked(tmp_path: Path, policy: GuardPolicy) -> None:
    """NFS: PV a with a running pod is blocked under both policies."""
    node = Node(tmp_path, "nfs.txt")
    verdict = node.check(node.global_mount("nfs.csi.k8s.io", "nfs-server#export#pv-a"), policy)
    assert not verdict.allowed
    assert RefKind.SAME_VOLUME in [r.kind for r in verdict.refs]
