"""Covers kubevol.cli.reconstruct and its repair (kubevol.node.plan) on a real node's root.

``kubevol reconstruct`` on a kubelet root shaped as a real node has it
(:mod:`kubevol.testing.kubelet_root`, built from the kubelet's code): every volume
reported, nothing failed; a repair with no pod named gone changes nothing at all; with one
pod named gone, exactly its volumes are torn down and nothing else changes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csidriver.server import serve_in_background
from kubevol.node.rootlock import RootLock
from kubevol.testing.csi_driver import FakeCSIDriver
from kubevol.testing.kubelet_root import (
    EPHEMERAL_DRIVER,
    PV_DRIVER,
    KubeletRoot,
)
from kubevol.testing.mount_rig import mounts_under
from tests.cli.test_repair_plan import run_json, tree_digest

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


def flags(real_node: KubeletRoot) -> list[str]:
    return ["--root", str(real_node.root), "--node-name", real_node.node_name]


def test_reconstruct_reports_every_volume_of_a_real_node_and_no_failure(
    real_node: KubeletRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every volume of a known kind comes back with its mount as it is — inline CSI
    ephemeral volumes from vol_data.json alone, with no driver registered — subPath binds
    under their volume, volumes of unknown plugins listed as left alone, no failure, and
    not one warning (the non-pod files of the root are not looked at)."""
    code, out, err = run_json(capsys, "reconstruct", *flags(real_node), "-o", "json")
    assert code == 0
    assert out["failures"] == [] and out["orphan_device_mounts"] == []
    assert "warning" not in err.lower()
    found = {(v["pod_uid"], v["plugin"], v["volume"]): v for v in out["volumes"]}
    expected = {(v.pod_uid, v.plugin, v.name): v for v in real_node.known}
    assert set(found) == set(expected)
    for key, v in expected.items():
        assert (found[key]["mount"] == "mounted") == v.mounted, found[key]
    for uid in real_node.pods:
        inline = found[(uid, "kubernetes.io/csi", "secrets-store")]
        assert inline["unique_name"] == f"kubernetes.io/csi/{uid}-secrets-store"
        assert inline["device_mount_path"] == "" and inline["device"] is None
        assert inline["path"].endswith("/volumes/kubernetes.io~csi/secrets-store/mount")
        shared = found[(uid, "kubernetes.io/csi", "pv-shared")]
        assert shared["device"] == "mounted"
        assert shared["device_mount_path"] == str(real_node.staging["pv-shared"])
    for bind in real_node.subpaths:
        [v] = [v for k, v in found.items() if k[0] == bind.pod_uid and k[2] == bind.volume]
        assert str(bind.path) in v["subpaths"]
    unknown = {(u["plugin"], u["volume"]): u["reason"] for u in out["unknown_plugins"]}
    assert unknown == {
        ("kubernetes.io/foo", "thing"): "unknown plugin 'kubernetes.io/foo', left alone",
        ("vendor/bar", "flex"): "unknown plugin 'vendor/bar', left alone",
    }


def test_repair_with_no_pod_named_gone_changes_nothing_at_all(
    tmp_path: Path, real_node: KubeletRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    """No pod on a kubelet's root is kubevol's: the plan has no action, lists every volume
    (and the unknown plugins' ones) as left alone; the dry run changes nothing at all, and
    the repair leaves every path, mode, content, link target and mount under the test
    directory as it was: it does not even take (create) kubevol's lock, so it neither
    waits for another writer's."""
    before = tree_digest(tmp_path)
    code, plan, _ = run_json(capsys, "reconstruct", *flags(real_node), "--repair", "--dry-run",
                             "-o", "json")
    assert code == 0 and plan["actions"] == []
    left = {(x["pod_uid"], x["volume"]) for x in plan["left"]}
    assert {(v.pod_uid, v.name) for v in real_node.volumes} <= left
    assert tree_digest(tmp_path) == before
    code, result, _ = run_json(capsys, "reconstruct", *flags(real_node), "--repair", "-o", "json")
    assert code == 0 and result["plan"]["actions"] == [] and result["failures"] == []
    assert tree_digest(tmp_path) == before
    assert not os.path.lexists(real_node.root / "kubevol")
    with RootLock(str(real_node.root), timeout=0):  # another writer holds the root
        code, result, err = run_json(capsys, "reconstruct", *flags(real_node), "--repair",
                                     "--timeout", "0.5", "-o", "json")
    assert code == 0 and result["plan"]["actions"] == []
    assert "waiting for root" not in err


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[list[str]]:
    """Both CSI drivers of the root, mounting for real (unpublish unmounts the target):
    ``--csi-driver`` flags for them."""
    handles = []
    out = []
    for name, sock in ((PV_DRIVER, "pv.sock"), (EPHEMERAL_DRIVER, "eph.sock")):
        state = tmp_path / f"state-{sock}"
        driver = FakeCSIDriver(name=name, node_id="node-1", state_dir=state, mounts=True)
        handle = serve_in_background(driver.plugin(), f"unix://{tmp_path / sock}", env={})
        handles.append(handle)
        out += ["--csi-driver", f"{name}={handle.address}"]
    try:
        yield out
    finally:
        for handle in handles:
            handle.stop(grace=0)


def test_repair_with_one_pod_named_gone_tears_down_exactly_its_volumes(
    tmp_path: Path, real_node: KubeletRoot, drivers: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Pod 1 named gone: each of its volumes (projected, configMap with its subPath bind,
    secret, downwardAPI, emptyDir, the shared PV's publish, the inline CSI volume) is
    unmounted and removed, then its directory; the shared PV's staging mount stays (the
    other pods use it), and every other path and mount is unchanged."""
    gone = real_node.pods[1]
    gone_dir = real_node.root / "pods" / gone
    others = [tmp_path / "root" / "kubevol", gone_dir,
              *(tmp_path / f"state-{s}" for s in ("pv.sock", "eph.sock"))]
    before = tree_digest(tmp_path, exclude=others)
    per_pod = {
        uid: tree_digest(real_node.root / "pods" / uid) for uid in real_node.pods if uid != gone
    }
    assert mounts_under(gone_dir)

    code, plan, _ = run_json(capsys, "reconstruct", *flags(real_node), *drivers, "--repair",
                             "--pod-gone", gone, "--dry-run", "-o", "json")
    assert code == 0
    assert {a["pod_uid"] for a in plan["actions"]} == {gone}
    planned = {(a["action"], a["volume"]) for a in plan["actions"]}
    for v in real_node.volumes_of(gone):
        assert ("remove dir", v.name) in planned
        if v.mounted:
            assert ("unmount", v.name) in planned
    assert ("remove pod dir", "") in planned
    assert not any(a["action"] in ("unstage", "detach") for a in plan["actions"])

    code, result, err = run_json(capsys, "reconstruct", *flags(real_node), *drivers, "--repair",
                                 "--pod-gone", gone, "-o", "json")
    assert code == 0, err
    assert result["plan"] == plan
    assert not os.path.lexists(gone_dir)
    assert mounts_under(gone_dir) == []
    assert str(real_node.staging["pv-shared"]) in mounts_under(real_node.root)
    assert tree_digest(tmp_path, exclude=others) == before
    assert {uid: tree_digest(real_node.root / "pods" / uid) for uid in per_pod} == per_pod


def test_a_gone_pod_with_an_unknown_plugins_volume_keeps_it_and_its_directory(
    tmp_path: Path, real_node: KubeletRoot, drivers: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Pod 0 named gone: its volumes of known kinds are torn down (its own PV unstaged from
    the shared loop device while the other PV's staging stays), but the volumes of unknown
    plugins stay as they are, mounted or not, and so does its directory: the plan says
    why."""
    gone = real_node.pods[0]
    unknown = [v for v in real_node.volumes_of(gone) if v.unknown]
    kept = {v.name: tree_digest(v.path) for v in unknown}
    others = {uid: tree_digest(real_node.root / "pods" / uid) for uid in real_node.pods[1:]}
    code, result, err = run_json(capsys, "reconstruct", *flags(real_node), *drivers, "--repair",
                                 "--pod-gone", gone, "-o", "json")
    assert code == 0, err
    left = {(x["volume"], x["reason"]) for x in result["plan"]["left"]}
    assert ("thing", "unknown plugin 'kubernetes.io/foo', left alone") in left
    assert ("flex", "unknown plugin 'vendor/bar', left alone") in left
    assert ("", "pod directory holds a volume of an unknown plugin, left alone") in left
    assert not any(a["action"] == "remove pod dir" for a in result["plan"]["actions"])
    assert {v.name: tree_digest(v.path) for v in unknown} == kept
    assert mounts_under(real_node.root / "pods" / gone) == [
        str(v.path) for v in unknown if v.mounted]
    for v in real_node.volumes_of(gone):
        assert os.path.lexists(v.path) == v.unknown, v
    assert str(real_node.staging["pv-logs"]) not in mounts_under(real_node.root)
    assert str(real_node.staging["pv-shared"]) in mounts_under(real_node.root)
    assert {uid: tree_digest(real_node.root / "pods" / uid) for uid in others} == others


def test_status_lists_unknown_plugins_volumes_as_such(
    real_node: KubeletRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubevol status` on a real node shows each volume of an unknown plugin with that
    state and why, not as unreadable, and does not try to measure it."""
    code, rows, err = run_json(capsys, "status", *flags(real_node), "-o", "json")
    assert code == 0, err
    by_volume = {(r["pod_uid"], r["spec_name"]): r for r in rows}
    for v in real_node.volumes:
        row = by_volume[(v.pod_uid, v.name)]
        if v.unknown:
            assert row["state"] == "unknown plugin"
            assert row["error"] == f"unknown plugin {v.plugin!r}, left alone"
            assert row["used"] is None and "metrics_error" not in row
        else:
            assert row["state"] != "unreadable", row


def test_a_subpath_bind_whose_volume_directory_is_gone_is_cleaned_only_for_a_gone_pod(
    tmp_path: Path, real_node: KubeletRoot, drivers: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Pod 1's configMap directory removed under its subPath bind: the bind is reported
    ("volume directory is gone") and, the pod being nobody's kubevol knows, left mounted;
    with the pod named gone the plan unmounts it, and the repair does so and removes the
    pod directory within the timeout (the bind no longer keeps it)."""
    uid = real_node.pods[1]
    pod_dir = real_node.root / "pods" / uid
    [bind] = [b for b in real_node.subpaths if b.pod_uid == uid]
    [volume] = [v for v in real_node.volumes_of(uid) if v.name == bind.volume]
    assert not volume.mounted  # a configMap on disk: its directory goes with rmtree
    shutil.rmtree(volume.path)
    assert str(bind.path) in mounts_under(pod_dir)

    code, out, err = run_json(capsys, "reconstruct", *flags(real_node), "-o", "json")
    assert code == 0, err
    [row] = out["orphan_subpaths"]
    assert (row["pod_uid"], row["volume"], row["path"], row["mounted"]) == (
        uid, bind.volume, str(bind.path), True)
    assert "volume directory is gone" in row["reason"]

    code, result, err = run_json(capsys, "reconstruct", *flags(real_node), "--repair", "-o", "json")
    assert code == 0, err
    assert result["plan"]["actions"] == []
    assert any(x["path"] == str(bind.path) and "not kubevol's" in x["reason"]
               for x in result["plan"]["left"])
    assert result["orphan_subpaths"][0]["cleanup"].startswith("left: ")
    assert str(bind.path) in mounts_under(pod_dir)

    code, result, err = run_json(capsys, "reconstruct", *flags(real_node), *drivers, "--repair",
                                 "--pod-gone", uid, "--timeout", "60", "-o", "json")
    assert code == 0, err
    planned = {(a["action"], a["volume"], a["path"]) for a in result["plan"]["actions"]}
    assert ("unmount subPath bind", bind.volume, str(bind.path)) in planned
    assert ("remove pod dir", "", str(pod_dir)) in planned
    assert result["orphan_subpaths"][0]["cleanup"] == "cleaned"
    assert mounts_under(pod_dir) == []
    assert not os.path.lexists(pod_dir)
