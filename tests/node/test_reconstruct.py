"""Covers kubevol.node.reconstruct.

Reconstruction from disk: the layout walk, mount checks, failures cleaned once, orphan
device mounts, and a read-only scan that changes nothing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kubevol.manager import PluginRoles
from kubevol.mount.mountread import PROC_MOUNTINFO
from kubevol.node.cleanup import CLEANED, Cleanup, CleanupKind
from kubevol.node.desired import desired_pod
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import Manifests, manifest_pod_uid
from kubevol.node.mountcheck import MountCheck
from kubevol.node.owners import Ownership
from kubevol.node.poddirs import list_pod_volume_dirs, only_leftovers, remove_volume_dir_leftovers
from kubevol.node.reconstruct import ScanPass, scan
from kubevol.node.state import MountState, VolumeMode
from kubevol.testing.mount_rig import MountRig, mounts_under
from tests.node.conftest import NodeEnv
from tests.node.fakes import claim_manifest, local_pv_manifest, pod_manifest


def set_up(
    env: NodeEnv, *pods: dict[str, Any], extra: tuple[dict[str, Any], ...] = ()
) -> list[str]:
    """Mount the pods' volumes with a manager that is then dropped (a crash)."""
    objects = (*pods, *extra)
    m = Manifests(
        pods=pods,
        pvs={o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolume"},
        pvcs={
            ("default", o["metadata"]["name"]): o
            for o in objects
            if o["kind"] == "PersistentVolumeClaim"
        },
    )
    manager = NodeVolumeManager(env.host, env.mgr, workers=2)
    for pod in pods:
        manager.set_pod(desired_pod(env.mgr, pod, m))
    assert manager.sync(timeout=20).converged
    manager.close()
    return [manifest_pod_uid(p) for p in pods]


def staged_pod(name: str) -> dict[str, Any]:
    claim = {"name": "data", "persistentVolumeClaim": {"claimName": "pv1-claim"}}
    return pod_manifest(name, [claim])


@pytest.mark.root
def test_walk_unescapes_plugins_and_checks_mounts(env: NodeEnv) -> None:
    """Each pod volume is found under its unescaped plugin with its mount checked."""
    pv = local_pv_manifest("pv1", str(env.source("pv1")))
    web = pod_manifest(
        "web",
        [{"name": "scratch", "emptyDir": {}}, {"name": "mem", "emptyDir": {"medium": "Memory"}}],
    )
    uid_web, uid_db = set_up(env, web, staged_pod("db"), extra=(pv, claim_manifest("pv1")))
    result = scan(env.host, env.mgr)
    assert result.failures == () and result.orphans == ()
    found = {(f.dir.pod_uid, f.dir.plugin_name, f.dir.spec_name): f for f in result.volumes}
    assert set(found) == {
        (uid_web, "kubernetes.io/empty-dir", "scratch"),
        (uid_web, "kubernetes.io/empty-dir", "mem"),
        (uid_db, "example.com/staged", "pv1"),
    }
    assert found[(uid_web, "kubernetes.io/empty-dir", "scratch")].mount is MountCheck.NOT_MOUNTED
    assert found[(uid_web, "kubernetes.io/empty-dir", "mem")].mount is MountCheck.MOUNTED
    staged = found[(uid_db, "example.com/staged", "pv1")]
    assert staged.mount is MountCheck.MOUNTED and staged.device is MountCheck.MOUNTED
    assert staged.unique_name == "example.com/staged/pv1"
    assert staged.device_mount_path.endswith("plugins/example.com/staged/mounts/pv1")
    assert found[(uid_web, "kubernetes.io/empty-dir", "mem")].unique_name == (
        f"kubernetes.io/empty-dir/{uid_web}-mem"
    )
    [shared] = [v for v in result.actual_state() if v.unique_name == "example.com/staged/pv1"]
    assert shared.device_state is MountState.UNCERTAIN
    assert shared.attach_state is MountState.UNCERTAIN
    assert [p.state for p in shared.pods] == [MountState.UNCERTAIN]
    # Clean up what the crashed manager left.
    manager = NodeVolumeManager(env.host, env.mgr, workers=2)
    manager.reconstruct()
    assert manager.sync(timeout=20).converged
    assert mounts_under(env.root) == []
    manager.close()


@pytest.mark.root
def test_a_pass_looks_each_plugin_up_once(env: NodeEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan is one pass: its volumes share one lookup per plugin name; the next scan (a
    new pass) looks them up again, so a plugin change between passes is seen."""
    pods = [pod_manifest(f"p{i}", [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}])
            for i in range(3)]
    set_up(env, *pods)
    asked: list[str] = []
    find = env.mgr.find_roles_by_name

    def counting(name: str) -> PluginRoles:
        asked.append(name)
        return find(name)

    monkeypatch.setattr(env.mgr, "find_roles_by_name", counting)
    for expected in (1, 2):
        result = scan(env.host, env.mgr)
        assert len(result.volumes) == 6 and result.failures == ()
        assert asked == ["kubernetes.io/empty-dir"] * expected
    pass_ = ScanPass(env.mgr)
    names = {pass_.reconstruct(f.dir).unique_name for f in result.volumes}
    assert names == {f.unique_name for f in result.volumes}
    assert asked == ["kubernetes.io/empty-dir"] * 3
    manager = NodeVolumeManager(env.host, env.mgr, workers=2)
    manager.reconstruct()
    assert manager.sync(timeout=20).converged
    manager.close()


@pytest.mark.root
def test_corrupted_pod_mount_is_reported_and_torn_down(env: NodeEnv, rig: MountRig) -> None:
    """A pod mount whose filesystem died reads as corrupted, and tear-down removes it."""
    pod = pod_manifest("web", [{"name": "mem", "emptyDir": {"medium": "Memory"}}])
    [uid] = set_up(env, pod)
    vol = env.root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "mem"
    os.system(f"umount {vol}")
    rig.corrupted(vol)
    result = scan(env.host, env.mgr)
    [found] = result.volumes
    assert found.mount is MountCheck.CORRUPTED
    manager = NodeVolumeManager(env.host, env.mgr, workers=2)
    manager.reconstruct()
    assert manager.sync(timeout=20).converged
    assert not (env.root / "pods" / uid).exists()
    manager.close()


@pytest.mark.root
def test_unreconstructable_volume_is_reported_then_cleaned_once(env: NodeEnv) -> None:
    """Corrupt plugin metadata: the volume is reported (never dropped) and cleaned once."""
    pv = local_pv_manifest("pv1", str(env.source("pv1")))
    [uid] = set_up(env, staged_pod("db"), extra=(pv, claim_manifest("pv1")))
    env.staged.meta_path("pv1")
    Path(env.staged.meta_path("pv1")).write_text("{not json")
    readonly = scan(env.host, env.mgr)
    [failure] = readonly.failures
    assert failure.dir.pod_uid == uid and failure.dir.plugin_name == "example.com/staged"
    assert "cannot reconstruct" in failure.reason and failure.cleanup.kind is CleanupKind.NOT_TRIED
    manager = NodeVolumeManager(env.host, env.mgr, workers=2)
    result = manager.reconstruct(clean=True)
    [failure] = result.failures
    assert failure.cleanup.kind is CleanupKind.CLEANED
    pod_mount = env.root / "pods" / uid / "volumes" / "example.com~staged" / "pv1"
    assert not pod_mount.exists()
    # The staged device mount no pod leads to any more is an orphan, unmounted too.
    [orphan] = result.orphans
    assert orphan.plugin_name == "example.com/staged" and orphan.cleanup.kind is CleanupKind.CLEANED
    assert mounts_under(env.root) == []
    assert manager.sync(timeout=20).converged
    assert not (env.root / "pods" / uid).exists()
    again = manager.reconstruct(clean=True)
    assert again.failures == () and again.orphans == ()
    manager.close()


@pytest.mark.root
def test_failure_of_a_desired_pod_is_left_for_set_up(env: NodeEnv) -> None:
    """A volume that fails reconstruction but whose pod is still wanted is not cleaned."""
    pv, pvc = local_pv_manifest("pv1", str(env.source("pv1"))), claim_manifest("pv1")
    pod = staged_pod("db")
    [uid] = set_up(env, pod, extra=(pv, pvc))
    Path(env.staged.meta_path("pv1")).unlink()
    manager = NodeVolumeManager(env.host, env.mgr, workers=2)
    manager.set_pod(
        desired_pod(env.mgr, pod, Manifests(pods=(pod,), pvs={"pv1": pv},
                                            pvcs={("default", "pv1-claim"): pvc}))
    )
    result = manager.reconstruct(clean=True)
    [failure] = result.failures
    assert str(failure.cleanup).startswith("left: the pod is desired")
    assert failure.cleanup.kind is CleanupKind.LEFT
    assert result.orphans == ()  # its device mount path is claimed by the desired volume
    assert manager.sync(timeout=20).converged
    assert os.path.exists(env.staged.meta_path("pv1"))
    manager.remove_pod(uid)
    assert manager.sync(timeout=20).converged
    assert mounts_under(env.root) == []
    manager.close()


@pytest.mark.root
def test_unknown_plugin_is_listed_as_left_alone_not_as_a_failure(
    env: NodeEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory of a plugin nobody registered (a third-party plugin on a real node) is
    listed with the plugin's name as left alone, without a warning; it is no failure."""
    d = env.root / "pods" / "uid-1" / "volumes" / "vendor.example~thing" / "vol"
    d.mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        result = scan(env.host, env.mgr)
    assert result.failures == () and caplog.records == []
    [unknown] = result.unknown
    assert unknown.dir.plugin_name == "vendor.example/thing"
    assert unknown.reason == "unknown plugin 'vendor.example/thing', left alone"
    assert result.to_dict()["unknown_plugins"][0]["path"] == str(d)


def test_list_pod_volume_dirs_reads_both_modes(tmp_path: Path) -> None:
    """volumes/ and volumeDevices/ entries are listed with their mode; files are ignored."""
    pods = tmp_path / "pods"
    (pods / "u1" / "volumes" / "kubernetes.io~csi" / "pv-a").mkdir(parents=True)
    (pods / "u1" / "volumeDevices" / "kubernetes.io~csi").mkdir(parents=True)
    os.symlink("/dev/null", pods / "u1" / "volumeDevices" / "kubernetes.io~csi" / "pv-b")
    (pods / "u1" / "etc-hosts").write_text("")
    (pods / "not-a-dir").write_text("")
    dirs = list_pod_volume_dirs(str(pods))
    assert [(d.spec_name, d.plugin_name, d.mode) for d in dirs] == [
        ("pv-a", "kubernetes.io/csi", VolumeMode.FILESYSTEM),
        ("pv-b", "kubernetes.io/csi", VolumeMode.BLOCK),
    ]
    assert list_pod_volume_dirs(str(tmp_path / "missing")) == []


def tree_digest(root: Path) -> str:
    """A hash of every path, its type, mode, owner, size, mtime and content under ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError as exc:  # a dead mount: its errno is part of the picture
                h.update(f"{path}|errno {exc.errno}\n".encode())
                continue
            h.update(f"{path}|{st.st_mode}|{st.st_uid}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def mount_table_under(base: Path) -> list[str]:
    with open(PROC_MOUNTINFO, encoding="utf-8") as f:
        return [line for line in f if str(base) in line]


@pytest.mark.root
def test_scan_changes_nothing_on_disk(env: NodeEnv, rig: MountRig) -> None:
    """A read-only scan of a tree with mounts, failures and orphans leaves the tree and the
    mount table exactly as they were."""
    pv = local_pv_manifest("pv1", str(env.source("pv1")))
    web = pod_manifest("web", [{"name": "mem", "emptyDir": {"medium": "Memory"}},
                               {"name": "disk", "emptyDir": {}}])
    uid_web, uid_db = set_up(env, web, staged_pod("db"), extra=(pv, claim_manifest("pv1")))
    Path(env.staged.meta_path("pv1")).write_text(json.dumps({"wrong": 1}))
    (env.root / "pods" / uid_web / "volumes" / "vendor~x" / "v").mkdir(parents=True)
    rig.corrupted(env.root / "pods" / "dead-pod" / "volumes" / "kubernetes.io~empty-dir" / "d")
    before = (tree_digest(env.root / "pods"), tree_digest(env.root / "plugins"),
              mount_table_under(env.tmp))
    result = scan(env.host, env.mgr)
    after = (tree_digest(env.root / "pods"), tree_digest(env.root / "plugins"),
             mount_table_under(env.tmp))
    assert before == after
    assert len(result.failures) == 1 and len(result.unknown) == 1 and len(result.orphans) == 1
    assert {f.mount for f in result.volumes} == {
        MountCheck.MOUNTED, MountCheck.NOT_MOUNTED, MountCheck.CORRUPTED,
    }
    assert uid_db in {f.dir.pod_uid for f in result.failures}


@pytest.mark.root
def test_leftovers_of_an_interrupted_tear_down_are_told_from_data(env: NodeEnv) -> None:
    """Metadata (and a half-written copy) plus an empty mount dir are leftovers and go;
    any other file makes the directory pod data, which is never removed."""
    mounter = env.host.get_mounter()
    csi = env.mgr.find_plugin_by_name("kubernetes.io/csi")
    vol = env.root / "pods" / "u1" / "volumes" / "kubernetes.io~csi" / "pv1"
    (vol / "mount").mkdir(parents=True)
    (vol / ".vol_data.x1y2z3").write_text("{")
    (vol / "vol_data.json").write_text("{}")
    assert only_leftovers(str(vol), mounter, csi)
    (vol / "mount" / "data.db").write_text("precious")
    assert not only_leftovers(str(vol), mounter, csi)
    with pytest.raises(OSError, match="more than a plugin's leftovers"):
        remove_volume_dir_leftovers(str(vol), mounter, csi)
    assert (vol / "mount" / "data.db").read_text() == "precious"
    (vol / "mount" / "data.db").unlink()
    remove_volume_dir_leftovers(str(vol), mounter, csi)
    assert not vol.exists()


@pytest.mark.root
def test_leftovers_are_what_the_plugin_says_they_are(env: NodeEnv) -> None:
    """CSI's file names mean nothing to another plugin: in an emptyDir volume directory a
    vol_data.json and an empty ``mount`` directory are pod data, so nothing is removed; for
    an unknown plugin (None) the same."""
    mounter = env.host.get_mounter()
    empty_dir = env.mgr.find_plugin_by_name("kubernetes.io/empty-dir")
    vol = env.root / "pods" / "u1" / "volumes" / "kubernetes.io~empty-dir" / "cache"
    (vol / "mount").mkdir(parents=True)
    (vol / "vol_data.json").write_text("{}")
    assert not only_leftovers(str(vol), mounter, empty_dir)
    assert not only_leftovers(str(vol), mounter, None)
    with pytest.raises(OSError, match="more than a plugin's leftovers"):
        remove_volume_dir_leftovers(str(vol), mounter, None)
    assert (vol / "vol_data.json").read_text() == "{}" and (vol / "mount").is_dir()


@pytest.mark.root
def test_failure_and_orphan_of_a_pod_not_owned_are_left_alone(env: NodeEnv) -> None:
    """A manager that does not own the pod (no record, not named gone) neither cleans its
    volume that could not be rebuilt nor unmounts the device mount it led to: both are
    reported with the reason, and every mount stays."""
    pv = local_pv_manifest("pv1", str(env.source("pv1")))
    [uid] = set_up(env, staged_pod("db"), extra=(pv, claim_manifest("pv1")))
    Path(env.staged.meta_path("pv1")).write_text("{not json")
    before = mounts_under(env.root)
    manager = NodeVolumeManager(env.host, env.mgr, workers=2,
                                ownership=Ownership(recorded=lambda: {"other"}))
    result = manager.reconstruct(clean=True)
    [failure] = result.failures
    assert failure.dir.pod_uid == uid
    assert failure.cleanup == Cleanup.left(
        "not kubevol's: no pod record and not named gone (--pod-gone)"
    )
    [orphan] = result.orphans
    assert orphan.cleanup.kind is CleanupKind.LEFT
    assert orphan.cleanup.detail.startswith("1 pod(s) of another owner")
    assert uid in orphan.cleanup.detail
    assert manager.sync(timeout=5).converged
    assert mounts_under(env.root) == before
    manager.close()
    # Named gone, the same pod is the manager's: cleaned, and its device mount unmounted.
    manager = NodeVolumeManager(env.host, env.mgr, workers=2, ownership=Ownership(gone=[uid]))
    result = manager.reconstruct(clean=True)
    assert [f.cleanup for f in result.failures] == [CLEANED]
    assert [o.cleanup for o in result.orphans] == [CLEANED]
    assert manager.sync(timeout=20).converged
    assert mounts_under(env.root) == []
    manager.close()
