"""Covers kubevol.mount.guard.

The unstage guard on real mounts: every row of the issue's table under both policies.

Lustre's shape is reproduced with an ext4 image on a loop device mounted at several staging
paths: every mount shows the same major:minor and root ``/``, which is what every Lustre
mount of one filesystem shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubevol.errors import DeviceStillMountedError
from kubevol.mount import (
    GuardPolicy,
    LinuxMounter,
    RefKind,
    UnmountGuard,
    UnmountVerdict,
    check_unmount_device,
    kubelet_refs_verdict,
)
from kubevol.testing.mount_rig import KubeletTree, MountRig

BOTH = [GuardPolicy.KUBELET, GuardPolicy.SAFE]
KUBELET_BLOCKS_SAFE_ALLOWS = [(GuardPolicy.KUBELET, False), (GuardPolicy.SAFE, True)]
KUBELET_ALLOWS_SAFE_BLOCKS = [(GuardPolicy.KUBELET, True), (GuardPolicy.SAFE, False)]


def check(
    path: Path, kubelet: KubeletTree, policy: GuardPolicy, *, detach_follows: bool = False
) -> UnmountVerdict:
    """The guard's verdict for ``path`` under ``kubelet``'s root."""
    return check_unmount_device(
        str(path), root_dir=str(kubelet.root), policy=policy, detach_follows=detach_follows
    )


def kinds(verdict: UnmountVerdict) -> dict[str, RefKind]:
    """mount point -> kind of every reference."""
    return {r.mount_point: r.kind for r in verdict.refs}


@pytest.mark.root
@pytest.mark.parametrize("policy", BOTH)
def test_staged_alone_is_allowed(rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy) -> None:
    """Row 1: a volume staged with no other mount of its device may be unstaged."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    verdict = check(staging, kubelet, policy)
    assert verdict.allowed
    assert verdict.refs == ()


@pytest.mark.root
@pytest.mark.parametrize("policy", BOTH)
def test_pod_of_same_volume_blocks(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy
) -> None:
    """Row 2: a pod of the same volume still bind-mounting the staging path blocks."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    pod = rig.bind(staging, kubelet.pod_mount("pod-1", "pv-a", "vol-a"))
    verdict = check(staging, kubelet, policy)
    assert not verdict.allowed
    assert kinds(verdict) == {str(pod): RefKind.SAME_VOLUME}
    assert [r.blocking for r in verdict.refs] == [True]


@pytest.mark.root
@pytest.mark.parametrize(("policy", "allowed"), KUBELET_BLOCKS_SAFE_ALLOWS)
def test_other_volume_staged_same_source(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy, allowed: bool
) -> None:
    """Row 3: another volume staged from the same filesystem and source: the kubelet bug
    blocks, safe allows."""
    dev = rig.loop()
    staging_a = rig.mount(dev, kubelet.global_mount("vol-a"))
    staging_b = rig.mount(dev, kubelet.global_mount("vol-b"))
    verdict = check(staging_a, kubelet, policy)
    assert verdict.allowed is allowed
    assert kinds(verdict) == {str(staging_b): RefKind.OTHER_VOLUME}


@pytest.mark.root
@pytest.mark.parametrize(("policy", "allowed"), KUBELET_BLOCKS_SAFE_ALLOWS)
def test_other_volume_staged_other_source(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy, allowed: bool
) -> None:
    """Row 3b: another volume of the filesystem staged from another source (Lustre's
    ``fs/sub``: same device, root ``/``, other source): the kubelet blocks, safe allows."""
    dev = rig.loop()
    alias = rig.device_alias(dev, rig.base / "lustre-fs-sub")
    staging_a = rig.mount(dev, kubelet.global_mount("vol-a"))
    staging_b = rig.mount(str(alias), kubelet.global_mount("vol-b"))
    verdict = check(staging_a, kubelet, policy)
    assert verdict.allowed is allowed
    assert kinds(verdict) == {str(staging_b): RefKind.OTHER_VOLUME}


@pytest.mark.root
@pytest.mark.parametrize(("policy", "allowed"), KUBELET_BLOCKS_SAFE_ALLOWS)
def test_pod_of_other_volume(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy, allowed: bool
) -> None:
    """Row 4: a pod of another volume of the same filesystem: the kubelet blocks, safe allows."""
    dev = rig.loop()
    staging_a = rig.mount(dev, kubelet.global_mount("vol-a"))
    staging_b = rig.mount(dev, kubelet.global_mount("vol-b"))
    pod_b = rig.bind(staging_b, kubelet.pod_mount("pod-2", "pv-b", "vol-b"))
    verdict = check(staging_a, kubelet, policy)
    assert verdict.allowed is allowed
    assert kinds(verdict) == {
        str(staging_b): RefKind.OTHER_VOLUME,
        str(pod_b): RefKind.OTHER_VOLUME,
    }


@pytest.mark.root
def test_other_volume_blocks_when_detach_follows(rig: MountRig, kubelet: KubeletTree) -> None:
    """Detaching the device would break another volume's mount: safe blocks then."""
    dev = rig.loop()
    staging_a = rig.mount(dev, kubelet.global_mount("vol-a"))
    rig.mount(dev, kubelet.global_mount("vol-b"))
    verdict = check(staging_a, kubelet, GuardPolicy.SAFE, detach_follows=True)
    assert not verdict.allowed


@pytest.mark.root
@pytest.mark.parametrize("policy", BOTH)
def test_kubelet_root_bind_mounted_elsewhere(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy, tmp_path: Path
) -> None:
    """Row 5: the kubelet root bind-mounted elsewhere shows the staging path again: allowed."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    alias_root = rig.rbind(kubelet.root, tmp_path / "root-alias")
    alias = alias_root / staging.relative_to(kubelet.root)
    verdict = check(staging, kubelet, policy)
    assert verdict.allowed
    assert kinds(verdict) == {str(alias): RefKind.KUBELET_ROOT_ALIAS}
    assert not verdict.refs[0].blocking


@pytest.mark.root
@pytest.mark.parametrize("detach_follows", [False, True])
def test_same_device_under_a_second_kubelet_root_blocks(
    rig: MountRig, kubelet: KubeletTree, tmp_path: Path, detach_follows: bool
) -> None:
    """Issue 20 point 7a: the loop device staged at the same place under another
    kubelet-style root is another user of the device, not an alias of this root (its path
    merely ends like ours): safe blocks, with a detach following or without (a local block
    device)."""
    dev = rig.loop()
    staging = rig.mount(dev, kubelet.global_mount("vol-a"))
    other = KubeletTree(tmp_path / "other-kubelet")
    elsewhere = rig.mount(dev, other.global_mount("vol-a"))
    verdict = check(staging, kubelet, GuardPolicy.SAFE, detach_follows=detach_follows)
    assert not verdict.allowed
    assert kinds(verdict) == {str(elsewhere): RefKind.FOREIGN}
    assert verdict.blocking_refs[0].mount_point == str(elsewhere)


@pytest.mark.root
def test_whole_filesystem_elsewhere_blocks_a_sub_directory_staging_when_detach_follows(
    rig: MountRig, kubelet: KubeletTree, tmp_path: Path
) -> None:
    """Issue 20 point 7b: the staging mount is a bind of a sub-directory; the whole
    filesystem is mounted elsewhere. A detach would take the device from that mount too,
    so it blocks whatever its root; with no detach it is not a user of this volume."""
    whole = rig.mount(rig.loop(), tmp_path / "whole")
    (whole / "sub").mkdir()
    staging = rig.bind(whole / "sub", kubelet.global_mount("vol-a"))
    verdict = check(staging, kubelet, GuardPolicy.SAFE, detach_follows=True)
    assert not verdict.allowed
    assert kinds(verdict) == {str(whole): RefKind.FOREIGN}
    assert "filesystem path /" in verdict.refs[0].reason
    assert check(staging, kubelet, GuardPolicy.SAFE).allowed


@pytest.mark.root
def test_bind_from_the_roots_own_filesystem_with_detach_is_allowed(
    rig: MountRig, kubelet: KubeletTree, tmp_path: Path
) -> None:
    """A hostpath-style staging mount binds a directory of the filesystem holding the
    kubelet root: no detach can take that device away, so the filesystem's other mounts
    (the node's own) do not block even with a detach following; a bind of the volume's
    directory elsewhere still does."""
    source = tmp_path / "volumes" / "v1"
    source.mkdir(parents=True)
    staging = rig.bind(source, kubelet.global_mount("vol-a"))
    verdict = check(staging, kubelet, GuardPolicy.SAFE, detach_follows=True)
    assert verdict.allowed, verdict.message
    other = rig.bind(source, tmp_path / "someone-else")
    verdict = check(staging, kubelet, GuardPolicy.SAFE, detach_follows=True)
    assert not verdict.allowed
    assert [r.mount_point for r in verdict.blocking_refs] == [str(other)]


@pytest.mark.root
def test_a_bind_of_the_roots_parent_is_not_an_alias(
    rig: MountRig, kubelet: KubeletTree, tmp_path: Path
) -> None:
    """A bind of the root's parent shows the staging path again under another path, but it
    is not a bind of the root itself (test_kubelet_root_bind_mounted_elsewhere: that one
    is an alias): the mount seen there is a user like any other, and a local block
    device's user blocks."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    parent_bind = rig.rbind(kubelet.root.parent, tmp_path.parent / f"{tmp_path.name}-parent")
    seen = parent_bind / kubelet.root.name / staging.relative_to(kubelet.root)
    verdict = check(staging, kubelet, GuardPolicy.SAFE)
    assert kinds(verdict)[str(seen)] is RefKind.FOREIGN
    assert not verdict.allowed


@pytest.mark.root
@pytest.mark.parametrize("policy", BOTH)
def test_foreign_mount_with_detach_blocks(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy, tmp_path: Path
) -> None:
    """Row 6: the device mounted outside the root by someone else, and a detach follows: blocked."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    foreign = rig.bind(staging, tmp_path / "someone-else")
    verdict = check(staging, kubelet, policy, detach_follows=True)
    assert not verdict.allowed
    assert kinds(verdict) == {str(foreign): RefKind.FOREIGN}


@pytest.mark.root
@pytest.mark.parametrize(("policy", "allowed"), KUBELET_BLOCKS_SAFE_ALLOWS)
def test_foreign_mount_of_network_fs_without_detach(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy, allowed: bool, tmp_path: Path
) -> None:
    """Row 7: a foreign mount of a filesystem that is not a local block device, no detach:
    the kubelet blocks; safe allows and reports it as a warning."""
    staging = rig.tmpfs(kubelet.global_mount("vol-a"))
    foreign = rig.bind(staging, tmp_path / "someone-else")
    verdict = check(staging, kubelet, policy)
    assert verdict.allowed is allowed
    assert kinds(verdict) == {str(foreign): RefKind.FOREIGN}
    if policy is GuardPolicy.SAFE:
        assert len(verdict.warnings) == 1
        assert verdict.warnings[0].startswith(f"{foreign}: ")
        assert "warning" in verdict.refs[0].reason


@pytest.mark.root
def test_foreign_mount_of_local_block_device_blocks(
    rig: MountRig, kubelet: KubeletTree, tmp_path: Path
) -> None:
    """Safe still blocks a foreign user of a local block device, even with no detach."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    rig.bind(staging, tmp_path / "someone-else")
    verdict = check(staging, kubelet, GuardPolicy.SAFE)
    assert not verdict.allowed
    assert verdict.warnings == ()


@pytest.mark.root
@pytest.mark.parametrize(("policy", "allowed"), KUBELET_ALLOWS_SAFE_BLOCKS)
def test_subdirectory_bind_in_pod_of_same_volume(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy, allowed: bool
) -> None:
    """Row 8: a pod of the same volume binds a sub-directory of the staging path: the
    kubelet misses it (other root), safe blocks."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    (staging / "sub").mkdir()
    pod = rig.bind(staging / "sub", kubelet.pod_mount("pod-1", "pv-a", "vol-a"))
    verdict = check(staging, kubelet, policy)
    assert verdict.allowed is allowed
    if policy is GuardPolicy.SAFE:
        assert kinds(verdict) == {str(pod): RefKind.SAME_VOLUME}
        assert "/sub" in verdict.refs[0].reason
    else:
        assert verdict.refs == ()


@pytest.mark.root
def test_subpath_bind_is_attributed_to_its_volume(rig: MountRig, kubelet: KubeletTree) -> None:
    """A subPath bind (pods/<uid>/volume-subpaths/<vol>/...) counts as its volume's user."""
    staging = rig.mount(rig.loop(), kubelet.global_mount("vol-a"))
    (staging / "data").mkdir()
    pod = rig.bind(staging, kubelet.pod_mount("pod-1", "pv-a", "vol-a"))
    subpath = rig.bind(
        staging / "data", kubelet.root / "pods/pod-1/volume-subpaths/pv-a/app/0"
    )
    verdict = check(staging, kubelet, GuardPolicy.SAFE)
    assert kinds(verdict) == {str(pod): RefKind.SAME_VOLUME, str(subpath): RefKind.SAME_VOLUME}
    assert not verdict.allowed


@pytest.mark.parametrize("policy", BOTH)
def test_missing_path_is_allowed(kubelet: KubeletTree, policy: GuardPolicy) -> None:
    """Row 9a: a device mount path that does not exist is allowed, with no refs."""
    verdict = check(kubelet.root / "plugins/kubernetes.io/csi/d/gone/globalmount", kubelet, policy)
    assert verdict.allowed
    assert verdict.refs == ()


@pytest.mark.root
@pytest.mark.parametrize("policy", BOTH)
def test_corrupted_mount_is_allowed(
    rig: MountRig, kubelet: KubeletTree, policy: GuardPolicy
) -> None:
    """Row 9b: a corrupted mount (FUSE daemon gone: ENOTCONN) is allowed, with no refs."""
    staging = rig.corrupted(kubelet.global_mount("vol-a"))
    verdict = check(staging, kubelet, policy)
    assert verdict.allowed
    assert verdict.refs == ()
    assert "corrupted" in verdict.message


@pytest.mark.root
def test_kubelet_policy_reproduces_kubernetes_error_text(
    rig: MountRig, kubelet: KubeletTree
) -> None:
    """A blocked kubelet verdict carries Kubernetes' message and refs, in table order."""
    dev = rig.loop()
    staging_a = rig.mount(dev, kubelet.global_mount("vol-a"))
    staging_b = rig.mount(dev, kubelet.global_mount("vol-b"))
    pod = rig.bind(staging_a, kubelet.pod_mount("pod-1", "pv-a", "vol-a"))
    verdict = check(staging_a, kubelet, GuardPolicy.KUBELET)
    assert verdict.message == (
        f'the device mount path "{staging_a}" is still mounted by other references '
        f"[{staging_b} {pod}]"
    )
    with pytest.raises(DeviceStillMountedError) as info:
        verdict.raise_if_blocked()
    assert info.value.refs == (str(staging_b), str(pod))


@pytest.mark.root
def test_kubelet_policy_refs_match_get_mount_refs(rig: MountRig, kubelet: KubeletTree) -> None:
    """The kubelet policy's refs are exactly LinuxMounter.get_mount_refs (SearchMountPoints)."""
    dev = rig.loop()
    staging_a = rig.mount(dev, kubelet.global_mount("vol-a"))
    rig.mount(dev, kubelet.global_mount("vol-b"))
    (staging_a / "sub").mkdir()
    rig.bind(staging_a / "sub", kubelet.pod_mount("pod-1", "pv-a", "vol-a"))
    rig.bind(staging_a, kubelet.pod_mount("pod-2", "pv-a", "vol-a"))
    verdict = check(staging_a, kubelet, GuardPolicy.KUBELET)
    mounter = LinuxMounter()
    try:
        assert [r.mount_point for r in verdict.refs] == mounter.get_mount_refs(str(staging_a))
    finally:
        mounter.close()
    assert len(verdict.refs) == 2


@pytest.mark.root
def test_kubelet_rule_on_a_plugins_refs_matches_the_table_verdict(
    rig: MountRig, kubelet: KubeletTree
) -> None:
    """kubelet_refs_verdict (the plugins' default verdict) on get_mount_refs decides as the
    kubelet policy on the table does: the same refs counted, the same message; a bind of the
    root showing the staging path is not counted; the refs stay unattributed."""
    dev = rig.loop()
    staging_a = rig.mount(dev, kubelet.global_mount("vol-a"))
    staging_b = rig.mount(dev, kubelet.global_mount("vol-b"))
    alias = rig.base / "alias" / kubelet.global_mount("vol-a").relative_to(kubelet.root)
    mounter = LinuxMounter()
    try:
        refs = [*mounter.get_mount_refs(str(staging_a)), str(alias)]
    finally:
        mounter.close()
    verdict = kubelet_refs_verdict(str(staging_a), refs)
    table_verdict = check(staging_a, kubelet, GuardPolicy.KUBELET)
    assert [r.mount_point for r in verdict.blocking_refs] == [str(staging_b)]
    assert [r.mount_point for r in table_verdict.blocking_refs] == [str(staging_b)]
    assert {r.kind for r in verdict.refs} == {RefKind.UNATTRIBUTED}
    assert [r.blocking for r in verdict.refs] == [True, False]
    assert verdict.policy is GuardPolicy.KUBELET and not verdict.allowed
    assert verdict.message == (
        f'the device mount path "{staging_a}" is still mounted by other references '
        f"[{staging_b} {alias}]"
    )
    assert kubelet_refs_verdict(str(staging_a), [str(alias)]).allowed
    assert kubelet_refs_verdict(str(staging_a), []).allowed


@pytest.mark.root
def test_guard_rereads_table_only_after_a_change(rig: MountRig, kubelet: KubeletTree) -> None:
    """UnmountGuard reads the mount table once while it is unchanged, again after a mount."""
    dev = rig.loop()
    staging = rig.mount(dev, kubelet.global_mount("vol-a"))
    with UnmountGuard(root_dir=str(kubelet.root)) as guard:
        for _ in range(5):
            assert guard.check(str(staging)).allowed
        assert guard.table_reads == 1
        rig.bind(staging, kubelet.pod_mount("pod-1", "pv-a", "vol-a"))
        assert not guard.check(str(staging)).allowed
        assert guard.table_reads == 2


def test_unknown_policy_is_rejected(kubelet: KubeletTree) -> None:
    """An unknown policy name is a ValueError naming it."""
    with pytest.raises(ValueError, match="strict"):
        check_unmount_device(str(kubelet.root), root_dir=str(kubelet.root), policy="strict")
