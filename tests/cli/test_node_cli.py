"""Covers kubevol.cli's node commands (up, down, status, reconstruct, demo) end to end.

``kubevol up``, ``down``, ``status``, ``reconstruct`` and ``demo`` end to end: real mounts,
the bundled hostpath CSI driver on a unix socket, the command line as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.manager import VolumePluginMgr
from kubevol.mount.mountread import read_mountinfo_bytes
from kubevol.mount.syscalls import MS_BIND, mount
from kubevol.node.privileges import missing_privileges
from kubevol.node.records import PodRecord, PodRecords
from kubevol.plugin import VolumePlugin
from kubevol.spec import Spec
from kubevol.testing.mount_rig import mounts_under, unmount_all_under
from tests.csi.support import HostPathServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def driver(serve_hostpath: HostPathServer) -> RunningDriver:
    """The hostpath driver served in-process; everything under tmp_path unmounted after."""
    return serve_hostpath()


def write_manifest(tmp_path: Path, handle: str, *, claim_volume: str = "pv1") -> Path:
    text = f"""
apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv1}}
spec:
  capacity: {{storage: 64Mi}}
  accessModes: [ReadWriteOnce]
  csi: {{driver: {DRIVER_NAME}, volumeHandle: "{handle}"}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: shop}}
spec: {{volumeName: {claim_volume}, accessModes: [ReadWriteOnce]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: shop, uid: 11111111-2222-3333-4444-555555555555}}
spec:
  containers: [{{name: c, image: x}}]
  volumes:
  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}
  - {{name: cache, emptyDir: {{medium: Memory, sizeLimit: 8Mi}}}}
  - {{name: logs, hostPath: {{path: {tmp_path}/logs, type: DirectoryOrCreate}}}}
"""
    path = tmp_path / "web.yaml"
    path.write_text(text)
    return path


def create_volume(driver: RunningDriver) -> str:
    with CSIClient(driver.endpoint) as client:
        volume = client.create_volume(
            "v1", [t.VolumeCapability.mount()],
            capacity_range=t.CapacityRange(required_bytes=64 << 20),
        )
    return volume.volume_id


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


UID = "11111111-2222-3333-4444-555555555555"


@pytest.mark.root
def test_up_status_reconstruct_down(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod with a CSI, an emptyDir and a hostPath volume goes up, is listed with usage,
    reconstructed read-only, and goes down leaving nothing (the driver remembered)."""
    manifest = write_manifest(tmp_path, create_volume(driver))
    root = str(tmp_path / "root")
    flags = ["--root", root, "--node-name", "n1"]
    code, rows = run_json(capsys, "up", *flags, "--csi-driver",
                          f"{DRIVER_NAME}={driver.endpoint}", "-o", "json", str(manifest))
    assert code == 0
    assert isinstance(rows, list)
    assert {(r["volume"], r["plugin"], r["state"]) for r in rows} == {
        ("data", "kubernetes.io/csi", "mounted"),
        ("cache", "kubernetes.io/empty-dir", "mounted"),
        ("logs", "kubernetes.io/host-path", "host path"),
    }
    csi_mount = f"{root}/pods/{UID}/volumes/kubernetes.io~csi/pv1/mount"
    assert csi_mount in mounts_under(tmp_path)

    code, status = run_json(capsys, "status", *flags, "-o", "json")
    assert code == 0 and isinstance(status, list)
    by_volume = {r["volume"]: r for r in status}
    assert by_volume["data"]["state"] == "mounted" and by_volume["data"]["desired"] == "running"
    assert by_volume["data"]["capacity"] == 64 << 20
    assert by_volume["cache"]["capacity"] == 8 << 20
    assert by_volume["logs"]["state"] == "host path"
    assert all(r["pod"] == "shop/web" for r in status)

    code, found = run_json(capsys, "reconstruct", *flags, "-o", "json")
    assert code == 0 and isinstance(found, dict)
    assert {(v["plugin"], v["mount"]) for v in found["volumes"]} == {
        ("kubernetes.io/csi", "mounted"), ("kubernetes.io/empty-dir", "mounted"),
    }
    assert found["failures"] == [] and found["orphan_device_mounts"] == []
    # One vocabulary: each volume is in the same state in up, status and reconstruct.
    in_up = {r["volume"]: r["state"] for r in rows}
    assert in_up == {r["volume"]: r["state"] for r in status}
    assert {v["volume"]: v["mount"] for v in found["volumes"]} == {
        "pv1": in_up["data"], "cache": in_up["cache"]}

    assert main(["down", *flags, str(manifest)]) == 0
    assert f"{UID}: gone" in capsys.readouterr().out
    assert mounts_under(tmp_path) == []
    assert not os.path.exists(f"{root}/pods/{UID}")
    assert os.listdir(f"{root}/kubevol/pods") == []
    assert (tmp_path / "logs").is_dir()  # the node's own directory stays


@pytest.mark.root
def test_up_builds_each_volume_once_and_does_not_read_its_records_back(
    tmp_path: Path, driver: RunningDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``up`` looks each volume's plugin up once (one full lookup for its plugin and roles)
    and hands the records it writes to the volume manager without reading them back."""
    manifest = write_manifest(tmp_path, create_volume(driver))
    root = str(tmp_path / "root")
    lookups: list[str] = []
    reads: list[str] = []
    find, read = VolumePluginMgr.find_plugin_by_spec, PodRecords.read

    def counting_find(self: VolumePluginMgr, spec: Spec | None) -> VolumePlugin:
        lookups.append(spec.name() if spec is not None else "")
        return find(self, spec)

    def counting_read(self: PodRecords, uid: str) -> PodRecord | None:
        reads.append(uid)
        return read(self, uid)

    monkeypatch.setattr(VolumePluginMgr, "find_plugin_by_spec", counting_find)
    monkeypatch.setattr(PodRecords, "read", counting_read)
    assert main(["up", "--root", root, "--node-name", "n1", "--csi-driver",
                 f"{DRIVER_NAME}={driver.endpoint}", str(manifest)]) == 0
    assert sorted(lookups) == ["cache", "logs", "pv1"]
    assert reads == []
    assert os.listdir(f"{root}/kubevol/pods") == [f"{UID}.json"]
    monkeypatch.undo()
    assert main(["down", "--root", root, "--node-name", "n1", str(manifest)]) == 0
    assert mounts_under(tmp_path) == []


SCRATCH_POD = f"""
apiVersion: v1
kind: Pod
metadata: {{name: scratch, namespace: shop, uid: {UID}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes:
  - {{name: cache, emptyDir: {{}}}}
"""


@pytest.mark.root
def test_down_reads_each_record_once_before_tearing_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``down`` reads a pod's record once to mark it terminating and hands the record it
    writes to the volume manager without reading it back (then once more, to say the pod
    is gone once the record was removed); the mount table is read before the tear-down only
    for a pod with neither a record nor a directory."""
    manifest = tmp_path / "scratch.yaml"
    manifest.write_text(SCRATCH_POD)
    flags = ["--root", str(tmp_path / "root"), "--node-name", "n1"]
    assert main(["up", *flags, str(manifest)]) == 0
    reads: list[str] = []
    read = PodRecords.read

    def counting_read(self: PodRecords, uid: str) -> PodRecord | None:
        reads.append(uid)
        return read(self, uid)

    tables: list[bytes] = []

    def counting_table() -> bytes:
        tables.append(read_mountinfo_bytes())
        return tables[-1]

    monkeypatch.setattr(PodRecords, "read", counting_read)
    monkeypatch.setattr("kubevol.cli.down.read_mountinfo_bytes", counting_table)
    capsys.readouterr()
    assert main(["down", *flags, str(manifest)]) == 0
    assert f"{UID}: gone" in capsys.readouterr().out
    assert reads == [UID, UID]
    # A pod with a record is found without the mount table: it is read once, after.
    assert len(tables) == 1
    assert not (tmp_path / "root" / "pods" / UID).exists()
    assert os.listdir(tmp_path / "root" / "kubevol" / "pods") == []


@pytest.mark.root
def test_down_removes_a_recorded_pod_directory_that_holds_no_volume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod whose volumes are gone (a tear-down interrupted after them) but whose
    directory and record are left: ``down`` removes the directory and the record."""
    manifest = tmp_path / "scratch.yaml"
    manifest.write_text(SCRATCH_POD)
    root = tmp_path / "root"
    flags = ["--root", str(root), "--node-name", "n1"]
    assert main(["up", *flags, str(manifest)]) == 0
    volumes = root / "pods" / UID / "volumes" / "kubernetes.io~empty-dir"
    (volumes / "cache").rmdir()
    capsys.readouterr()
    assert main(["down", *flags, "--pod-uid", UID]) == 0
    assert f"{UID}: gone" in capsys.readouterr().out
    assert not (root / "pods" / UID).exists()
    assert os.listdir(root / "kubevol" / "pods") == []


@pytest.mark.root
def test_down_finds_a_pod_known_only_by_a_mount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod with no record and no directory, whose block volume's bind under the global
    map path (``.../volumeDevices/<spec>/dev/<uid>``) is still mounted, is not "not found":
    the mount table says it is there, and ``down`` says what is left of it."""
    root = tmp_path / "root"
    bind = root / "plugins" / "kubernetes.io" / "csi" / "volumeDevices" / "pv1" / "dev" / UID
    bind.mkdir(parents=True)
    source = tmp_path / "source"
    source.mkdir()
    mount(str(source), str(bind), "", MS_BIND)
    try:
        code = main(["down", "--root", str(root), "--node-name", "n1", "--pod-uid", UID])
        out = capsys.readouterr().out
        assert code == 1
        assert f"{UID}: still being torn down (1 mounts left, e.g. {bind})" in out
    finally:
        unmount_all_under(tmp_path)


@pytest.mark.root
def test_up_refuses_bad_manifest_and_changes_nothing(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A claim bound to no PersistentVolume: a usage error (64, a bad input file), a message
    naming it, nothing recorded."""
    manifest = write_manifest(tmp_path, "h", claim_volume="pv-missing")
    root = tmp_path / "root"
    code = main(["up", "--root", str(root), "--node-name", "n1", str(manifest)])
    assert code == 64
    assert "PersistentVolumeClaim shop/data is not bound" in capsys.readouterr().err
    assert not (root / "pods").exists()
    assert not (root / "kubevol" / "pods").exists() or not os.listdir(root / "kubevol" / "pods")


def foreign_pod_root(tmp_path: Path, driver: RunningDriver) -> list[str]:
    """A root with a pod (CSI volume staged + published, a tmpfs emptyDir) whose record is
    gone: a pod of another owner, as far as kubevol knows."""
    manifest = write_manifest(tmp_path, create_volume(driver))
    root = str(tmp_path / "root")
    flags = ["--root", root, "--node-name", "n1"]
    assert main(["up", *flags, "--csi-driver", f"{DRIVER_NAME}={driver.endpoint}",
                 str(manifest)]) == 0
    os.unlink(f"{root}/kubevol/pods/{UID}.json")
    return flags


@pytest.mark.root
def test_down_by_uid_tears_down_a_pod_only_found_on_disk(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod whose record is gone is left alone by up, and torn down by down --pod-uid."""
    flags = foreign_pod_root(tmp_path, driver)
    assert main(["up", *flags]) == 0  # converging the recorded pods does not touch it
    assert len(mounts_under(tmp_path)) == 3
    capsys.readouterr()
    code, status = run_json(capsys, "status", *flags, "-o", "json", "--no-metrics")
    assert code == 0
    assert isinstance(status, list) and {r["desired"] for r in status} == {"unknown"}
    assert main(["down", *flags, "--pod-uid", UID]) == 0
    assert mounts_under(tmp_path) == []


@pytest.mark.root
def test_reconstruct_repair_cleans_an_unreadable_volume_only_of_a_pod_named_gone(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod volume whose vol_data.json is corrupt, and its device mount's too (so that
    the mount table cannot tell it either), is reported read-only. --repair leaves
    it and everything of its pod alone while the pod is nobody's kubevol knows; with the
    pod named gone it unmounts it, tears the pod's other volumes down, and reports that
    the device no pod leads to any more cannot be unstaged (nothing says which volume it is)
    with exit status 1."""
    manifest = write_manifest(tmp_path, create_volume(driver))
    root = str(tmp_path / "root")
    flags = ["--root", root, "--node-name", "n1"]
    assert main(["up", *flags, "--csi-driver", f"{DRIVER_NAME}={driver.endpoint}",
                 str(manifest)]) == 0
    os.unlink(f"{root}/kubevol/pods/{UID}.json")
    vol_data = Path(f"{root}/pods/{UID}/volumes/kubernetes.io~csi/pv1/vol_data.json")
    vol_data.write_text("{broken")
    [device_vol_data] = Path(root, "plugins", "kubernetes.io", "csi").glob("*/*/vol_data.json")
    device_vol_data.write_text("{broken too")
    capsys.readouterr()
    code, found = run_json(capsys, "reconstruct", *flags, "-o", "json")
    assert code == 0 and isinstance(found, dict)
    [failure] = found["failures"]
    assert failure["volume"] == "pv1" and failure["cleanup"] == ""
    assert vol_data.read_text() == "{broken" and len(mounts_under(tmp_path)) == 3

    code, left = run_json(capsys, "reconstruct", *flags, "--repair", "-o", "json")
    assert isinstance(left, dict) and code == 0
    assert left["failures"][0]["cleanup"].startswith("left: not kubevol's")
    # The staging no rebuilt volume leads to is reported; the foreign pod may use it.
    [orphan] = left["orphan_device_mounts"]
    assert orphan["cleanup"].startswith("left: 1 pod(s) of another owner")
    assert vol_data.read_text() == "{broken" and len(mounts_under(tmp_path)) == 3

    code, repaired = run_json(capsys, "reconstruct", *flags, "--repair", "--pod-gone", UID,
                              "-o", "json")
    assert isinstance(repaired, dict)
    assert repaired["failures"][0]["cleanup"] == "cleaned"
    assert not os.path.exists(f"{root}/pods/{UID}/volumes/kubernetes.io~csi/pv1")
    [orphan] = repaired["orphan_device_mounts"]
    assert orphan["path"].endswith("/globalmount")
    assert orphan["cleanup"].startswith("failed:") and "vol_data.json" in orphan["cleanup"]
    assert code == 1
    # The staging stays (unknown volume); the pod's emptyDir is torn down.
    assert [m.rsplit("/", 1)[1] for m in mounts_under(tmp_path)] == ["globalmount"]


def test_pod_gone_needs_repair_and_valid_uids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--pod-gone without --repair, or a UID that is not a path segment, is refused as a
    usage error (64)."""
    (tmp_path / "root" / "pods").mkdir(parents=True)
    flags = ["--root", str(tmp_path / "root")]
    assert main(["reconstruct", *flags, "--pod-gone", "u1"]) == 64
    assert "--pods-gone-file and --dry-run go with --repair" in capsys.readouterr().err
    gone = tmp_path / "gone.txt"
    gone.write_text("# pods drained\nu1\n\n../etc\n")
    assert main(["reconstruct", *flags, "--repair", "--pods-gone-file", str(gone)]) == 64
    assert "'../etc'" in capsys.readouterr().err


@pytest.mark.root
def test_privilege_errors_say_what_is_missing_and_how_to_run(tmp_path: Path) -> None:
    """Without CAP_SYS_ADMIN, up fails at once naming the capability and the fix."""
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         sys.executable, "-m", "kubevol.cli.main", "up", "--root", str(tmp_path / "r"),
         str(tmp_path / "missing.yaml")],
        capture_output=True, text=True, check=False, cwd=REPO,
    )
    assert result.returncode == 1
    assert "kubevol up: this process lacks CAP_SYS_ADMIN" in result.stderr
    assert "sudo kubevol up" in result.stderr and "unshare" in result.stderr
    assert not (tmp_path / "r").exists()


def test_missing_privileges_reads_capabilities_and_namespaces(tmp_path: Path) -> None:
    """The check reads CapEff and the uid map: a user namespace cannot do loop devices."""
    status = tmp_path / "status"
    uid_map = tmp_path / "uid_map"
    status.write_text("Name:\tx\nCapEff:\t000001ffffffffff\n")
    uid_map.write_text("         0       1000          1\n")
    missing = missing_privileges(loop_devices=True, status_path=str(status),
                                 uid_map_path=str(uid_map))
    assert len(missing) == 1 and "user namespace" in missing[0]
    status.write_text("CapEff:\t0000000000000000\n")
    uid_map.write_text("0 0 4294967295\n")
    missing = missing_privileges(status_path=str(status), uid_map_path=str(uid_map))
    assert len(missing) == 1 and "CAP_SYS_ADMIN" in missing[0]


@pytest.mark.root
def test_demo_runs_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kubevol demo tells the whole story, passes every check and leaves nothing behind."""
    code = main(["demo", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "every check passed" in out and "PROBLEM" not in out
    assert "reconstructing the volumes from disk" in out
    assert os.listdir(tmp_path) == []
    assert mounts_under(tmp_path) == []


@pytest.mark.root
def test_demo_fails_when_a_check_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A broken example makes the demo exit 1 with the problem, still cleaning up."""
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "bad.yaml").write_text(
        "kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: x}]\n"
        "  volumes:\n  - {name: v, persistentVolumeClaim: {claimName: x}}\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    code = main(["demo", "--workdir", str(work), "--examples", str(examples)])
    out = capsys.readouterr().out
    assert code == 1
    assert "PersistentVolumeClaim default/x is not in the manifests" in out
    assert mounts_under(tmp_path) == []
