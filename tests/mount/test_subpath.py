"""Covers kubevol.mount.subpath.

subPath binds on real mounts: what works (directories, single files, links inside the
volume), every escape attempt refused without mounting anything outside the volume (a link
to /etc, a link in a middle component, ``..``, a link swapped in while binding), clean-up,
and a subPath bind of a CSI volume holding the unstage until it is gone."""

from __future__ import annotations

import ctypes
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from kubevol.errors import MountError
from kubevol.mount import LinuxMounter, check_unmount_device
from kubevol.mount.guard import RefKind
from kubevol.mount.subpath import (
    Subpath,
    SubPathError,
    clean_subpaths,
    list_subpaths,
    prepare_safe_subpath,
    safe_make_dir,
    safe_open,
    validate_sub_path,
)
from kubevol.testing.mount_rig import KubeletTree, MountRig, mounts_under


@pytest.fixture
def mounter() -> LinuxMounter:
    return LinuxMounter()


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """A volume directory with a config dir, a file and an outside world beside it."""
    vol = tmp_path / "kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/data"
    (vol / "conf").mkdir(parents=True)
    (vol / "conf/app.ini").write_text("inside")
    (vol / "file.txt").write_text("a file")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "app.ini").write_text("OUTSIDE")
    (outside / "secret").write_text("OUTSIDE")
    return vol


def subpath(volume: Path, sub: str, index: int = 0, container: str = "app") -> Subpath:
    return Subpath(volume_mount_index=index, path=str(volume / sub), volume_name="data",
                   volume_path=str(volume), pod_dir=str(volume.parents[2]),
                   container_name=container)


@pytest.mark.root
def test_directory_subpath_is_bound_at_the_kubelet_path(
    mounter: LinuxMounter, volume: Path, tmp_path: Path
) -> None:
    """pods/<uid>/volume-subpaths/<volume>/<container>/<index>, showing the subdirectory."""
    target = prepare_safe_subpath(mounter, subpath(volume, "conf", index=2))
    pod_dir = volume.parents[2]
    assert target == str(pod_dir / "volume-subpaths/data/app/2")
    assert Path(target, "app.ini").read_text() == "inside"
    assert prepare_safe_subpath(mounter, subpath(volume, "conf", index=2)) == target
    assert mounts_under(pod_dir / "volume-subpaths") == [target]
    assert list_subpaths(str(pod_dir), "data") == [target]
    clean_subpaths(mounter, str(pod_dir), "data")
    assert mounts_under(tmp_path) == []
    assert not (pod_dir / "volume-subpaths").exists()
    clean_subpaths(mounter, str(pod_dir), "data")  # idempotent


@pytest.mark.root
def test_single_file_subpath(mounter: LinuxMounter, volume: Path) -> None:
    """A subPath naming a file is bound onto a file."""
    target = prepare_safe_subpath(mounter, subpath(volume, "file.txt"))
    assert stat.S_ISREG(os.lstat(target).st_mode)
    assert Path(target).read_text() == "a file"
    clean_subpaths(mounter, str(volume.parents[2]), "data")
    assert not os.path.exists(target)


@pytest.mark.root
def test_link_inside_the_volume_is_followed(mounter: LinuxMounter, volume: Path) -> None:
    """A symlink to another place inside the volume is allowed (resolved first)."""
    os.symlink("conf", volume / "alias")
    target = prepare_safe_subpath(mounter, subpath(volume, "alias"))
    assert Path(target, "app.ini").read_text() == "inside"
    clean_subpaths(mounter, str(volume.parents[2]), "data")


@pytest.mark.parametrize(
    ("plant", "sub"),
    [
        (lambda v, o: os.symlink("/etc", v / "etc"), "etc"),
        (lambda v, o: os.symlink(str(o), v / "conf/mid"), "conf/mid/app.ini"),
        (lambda v, o: os.symlink(str(o / "secret"), v / "leak"), "leak"),
        (lambda v, o: os.symlink("../../../../../../outside", v / "rel"), "rel"),
    ],
    ids=["link-to-etc", "link-in-middle", "link-to-outside-file", "relative-link-out"],
)
def test_escapes_are_refused_and_mount_nothing(
    mounter: LinuxMounter, volume: Path, tmp_path: Path, plant: object, sub: str
) -> None:
    """Each link pointing out of the volume: SubPathError, no mount, no bind target."""
    plant(volume, tmp_path / "outside")  # type: ignore[operator]
    with pytest.raises(SubPathError, match="not within volume path"):
        prepare_safe_subpath(mounter, subpath(volume, sub))
    assert mounts_under(tmp_path) == []
    assert not (volume.parents[2] / "volume-subpaths/data/app/0").exists()


@pytest.mark.parametrize("sub", ["../outside", "conf/../../x", "/etc", "a/..", "x\0y"])
def test_backsteps_and_absolute_paths_are_invalid(sub: str) -> None:
    """``..`` components and absolute paths never reach the filesystem."""
    with pytest.raises(SubPathError):
        validate_sub_path(sub)


def test_a_link_swapped_in_after_resolution_is_refused(volume: Path, tmp_path: Path) -> None:
    """The path was checked, then a component became a link: the no-follow walk stops."""
    resolved = str(volume / "conf/app.ini")
    (volume / "conf").rename(volume / "conf.real")
    os.symlink(str(tmp_path / "outside"), volume / "conf")
    with pytest.raises(SubPathError, match=r"unexpected symlink found .*/conf$"):
        safe_open(resolved, str(volume))


def _exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): a directory and a link trade
    places with no moment where the name is missing."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


@pytest.mark.slow
def test_racing_swaps_never_bind_outside(
    mounter: LinuxMounter, volume: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread keeps exchanging the directory ``conf`` with a link to the outside while
    its file is bound as a subPath: every bind that succeeds shows the inside file. The
    set-up pauses after resolving links, so swaps land between the check and the walk."""
    resolve = os.path.realpath

    def slow_realpath(path: str, *, strict: bool = False) -> str:
        out = resolve(path, strict=strict)
        time.sleep(0.001)
        return out

    monkeypatch.setattr(os.path, "realpath", slow_realpath)
    evil = volume / "evil"
    os.symlink(str(tmp_path / "outside"), evil)
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        while not stop.is_set():
            _exchange(volume / "conf", evil)
            swaps[0] += 1

    thread = threading.Thread(target=swapper)
    thread.start()
    bound = 0
    refused: list[str] = []
    try:
        for i in range(200):
            try:
                target = prepare_safe_subpath(mounter, subpath(volume, "conf/app.ini", index=i))
            except (SubPathError, OSError) as exc:
                refused.append(str(exc))
                continue
            bound += 1
            assert Path(target).read_text() == "inside"
    finally:
        stop.set()
        thread.join()
        clean_subpaths(mounter, str(volume.parents[2]), "data")
    assert bound + len(refused) == 200
    assert swaps[0] > 0
    assert any("unexpected symlink" in r for r in refused)
    assert mounts_under(tmp_path) == []


def test_safe_make_dir_creates_missing_directories(volume: Path, tmp_path: Path) -> None:
    """Missing components are made with the given mode; a link out of the volume stops it."""
    old = os.umask(0o077)
    try:
        safe_make_dir("new/deeper", str(volume), 0o2775)
    finally:
        os.umask(old)
    assert stat.S_IMODE((volume / "new/deeper").stat().st_mode) == 0o2775
    safe_make_dir("new/deeper", str(volume), 0o755)  # exists: nothing to do
    os.symlink(str(tmp_path / "outside"), volume / "out")
    with pytest.raises(SubPathError, match="outside of allowed base"):
        safe_make_dir("out/made", str(volume), 0o755)
    assert not (tmp_path / "outside/made").exists()
    with pytest.raises(NotADirectoryError):
        safe_make_dir("file.txt", str(volume), 0o755)


@pytest.mark.root
def test_a_target_bound_elsewhere_is_rebound(mounter: LinuxMounter, volume: Path) -> None:
    """A stale bind at the target (another file) is replaced by the right one."""
    first = prepare_safe_subpath(mounter, subpath(volume, "conf"))
    (volume / "other").mkdir()
    (volume / "other/x").write_text("other")
    again = prepare_safe_subpath(mounter, subpath(volume, "other"))
    assert again == first
    assert Path(again, "x").read_text() == "other"
    clean_subpaths(mounter, str(volume.parents[2]), "data")
    assert mounts_under(volume.parents[2]) == []


@pytest.mark.root
def test_clean_leaves_data_when_unmount_fails(
    mounter: LinuxMounter, volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind that cannot be unmounted is left in place, never deleted through."""
    target = prepare_safe_subpath(mounter, subpath(volume, "conf"))

    def refuse(path: str) -> None:
        raise MountError(f"umount {path}: busy")

    monkeypatch.setattr(mounter, "unmount", refuse)
    with pytest.raises(MountError, match="busy"):
        clean_subpaths(mounter, str(volume.parents[2]), "data")
    assert Path(target, "app.ini").read_text() == "inside"
    monkeypatch.undo()
    clean_subpaths(mounter, str(volume.parents[2]), "data")


@pytest.mark.root
def test_subpath_of_a_csi_volume_blocks_its_unstage(
    mounter: LinuxMounter, tmp_path: Path
) -> None:
    """A CSI volume staged (tmpfs at globalmount), published to a pod, and a subPath bound
    from it: the unstage guard counts the subPath bind as the volume's own reference until
    it is cleaned, then allows the unstage once the pod's mount is gone too."""
    root = tmp_path / "kubelet"
    (tmp_path / "rig").mkdir()
    rig = MountRig(tmp_path / "rig")
    tree = KubeletTree(root)
    try:
        staged = rig.tmpfs(tree.global_mount("vol-1", driver="hostpath.csi.k8s.io"))
        (staged / "logs").mkdir()
        pod_mount = rig.bind(staged, tree.pod_mount("uid-1", "pv-1", "vol-1",
                                                    driver="hostpath.csi.k8s.io"))
        sp = Subpath(volume_mount_index=0, path=str(pod_mount / "logs"), volume_name="data",
                     volume_path=str(pod_mount), pod_dir=str(root / "pods/uid-1"),
                     container_name="app")
        target = prepare_safe_subpath(mounter, sp)
        rig.unmount(pod_mount)
        verdict = check_unmount_device(str(staged), root_dir=str(root))
        assert not verdict.allowed
        assert [r.mount_point for r in verdict.blocking_refs] == [target]
        assert verdict.blocking_refs[0].kind is RefKind.SAME_VOLUME
        clean_subpaths(mounter, str(root / "pods/uid-1"), "data")
        assert check_unmount_device(str(staged), root_dir=str(root)).allowed
    finally:
        rig.cleanup()
