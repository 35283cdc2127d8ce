"""Covers kubevol.cli's node commands (up, status, reconstruct, down, plugins) on bad input.

The node commands given hostile input (issue 20): each ends in one line on stderr and a
documented exit code, changes nothing it should not, and stays within bounded memory."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli import plugins as plugins_cli
from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.errors import KubevolError
from kubevol.node.rootlock import RootLock
from kubevol.testing.mount_rig import mounts_under
from tests.util.test_safeyaml import BOMB

#: Address-space cap for commands given hostile input: a bomb that got through would need
#: gigabytes.
MEMORY_CAP = 1536 * 1024 * 1024

#: What a kubevol process may take beyond its --timeout to start and stop (imports, gRPC;
#: the machine running the tests is shared and busy).
STARTUP_SLACK = 10.0


def run_kubevol(*argv: str, cap: int = MEMORY_CAP, timeout: float = 120
                ) -> subprocess.CompletedProcess[str]:
    """``kubevol ARGV`` in a child process with its address space capped."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", *argv], capture_output=True, text=True,
        timeout=timeout, preexec_fn=limit, check=False,
    )


@pytest.mark.root
def test_up_refuses_an_alias_bomb_in_bounded_memory(tmp_path: Path) -> None:
    """The 421-byte manifest that drove ``up`` to 3.9 GB: one line, exit 1, nothing recorded
    (issue 20, point 6)."""
    manifest = tmp_path / "bomb.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  bomb:\n"
        + "\n".join("    " + line for line in BOMB.splitlines()) + "\n"
    )
    root = tmp_path / "root"
    proc = run_kubevol("up", "--root", str(root), "--node-name", "n1", str(manifest))
    assert proc.returncode == 64, proc.stderr  # a bad input file
    assert "excessive aliasing" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # the --root notice and the error
    assert "Traceback" not in proc.stderr
    assert not (root / "kubevol" / "pods").exists() or not os.listdir(root / "kubevol" / "pods")


# -- a driver that stops answering ------------------------------------------------------------

DRIVER_PROCESS = Path(__file__).resolve().parents[1] / "node" / "driver_process.py"
POD_UID = "22222222-3333-4444-5555-666666666666"


@pytest.fixture
def driver_proc(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The hostpath driver in its own process (so that it can be stopped with SIGSTOP), its
    endpoint; killed and everything under tmp_path unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.fail("the node CLI tests need root (real mounts)")
    endpoint = f"unix://{tmp_path}/hp.sock"
    proc = subprocess.Popen([sys.executable, str(DRIVER_PROCESS), "--endpoint", endpoint,
                             "--state-dir", str(tmp_path / "hp"), "--node-id", "n1"])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "hp.sock").exists():
            assert time.monotonic() < deadline, "the driver did not start"
            time.sleep(0.05)
        yield proc, endpoint
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
        for point in reversed(mounts_under(tmp_path)):
            subprocess.run(["umount", "-l", point], check=False)


def csi_pod(tmp_path: Path, endpoint: str, *, block: bool = False) -> Path:
    """A pod with one CSI volume of the hostpath driver (created now), its manifest."""
    with CSIClient(endpoint) as client:
        cap = t.VolumeCapability.block() if block else t.VolumeCapability.mount()
        handle = client.create_volume(
            "v1", [cap], capacity_range=t.CapacityRange(required_bytes=32 << 20)
        ).volume_id
    mode = "Block" if block else "Filesystem"
    use = ("volumeDevices: [{name: data, devicePath: /dev/xvda}]" if block
           else "volumeMounts: [{name: data, mountPath: /data}]")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(f"""
apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv1}}
spec:
  capacity: {{storage: 32Mi}}
  accessModes: [ReadWriteOnce]
  volumeMode: {mode}
  csi: {{driver: {DRIVER_NAME}, volumeHandle: "{handle}"}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec: {{volumeName: pv1, accessModes: [ReadWriteOnce]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, uid: {POD_UID}}}
spec:
  containers: [{{name: c, image: x, {use}}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]
""")
    return manifest


@pytest.mark.root
def test_timeout_bounds_down_with_a_stopped_driver(
    tmp_path: Path, driver_proc: tuple[subprocess.Popen[bytes], str]
) -> None:
    """``down --timeout 3`` with a driver that accepts connections but never answers
    (SIGSTOP): done within the deadline (plus start-up), not after every RPC's own timeout;
    exit 1, the pod still recorded; once the driver runs again, ``down`` finishes (issue 20,
    point 8)."""
    proc, endpoint = driver_proc
    root = str(tmp_path / "root")
    flags = ("--root", root, "--node-name", "n1")
    manifest = csi_pod(tmp_path, endpoint)
    up = run_kubevol("up", *flags, "--csi-driver", f"{DRIVER_NAME}={endpoint}", str(manifest))
    assert up.returncode == 0, up.stderr
    proc.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    down = run_kubevol("down", *flags, "--timeout", "3", "--pod-uid", POD_UID)
    elapsed = time.monotonic() - started
    assert down.returncode == 1, down.stderr
    assert f"{POD_UID}: still being torn down" in down.stdout
    assert "Traceback" not in down.stderr
    print(f"down --timeout 3 with a stopped driver took {elapsed:.1f} s")
    assert elapsed < 3 + STARTUP_SLACK, f"down --timeout 3 took {elapsed:.1f} s"
    proc.send_signal(signal.SIGCONT)
    down = run_kubevol("down", *flags, "--pod-uid", POD_UID)
    assert down.returncode == 0, down.stderr
    assert mounts_under(tmp_path / "root") == []


@pytest.mark.root
def test_a_second_writer_waits_with_a_message_then_gives_up(tmp_path: Path) -> None:
    """While another process holds the root (an agent, another ``up``), ``up`` says who holds
    it, waits until its --timeout, and fails in one line having recorded nothing (issue 20,
    point 11)."""
    root = tmp_path / "root"
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: 33333333-4444-5555-6666-777777777777}"
        "\nspec:\n  containers: [{name: c, image: x}]\n"
        "  volumes: [{name: scratch, emptyDir: {}}]\n"
    )
    with RootLock(str(root)):
        proc = run_kubevol("up", "--root", str(root), "--node-name", "n1", "--timeout", "1",
                           str(manifest))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert f"waiting for root {root}, in use by process {os.getpid()}" in proc.stderr
    assert "gave up after" in lines[-1] and "Traceback" not in proc.stderr
    assert not (root / "pods").exists()
    assert not (root / "kubevol" / "pods").exists()


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (OSError(28, "No space left on device", "/root/kubevol/pods/x.json"), 1,
         "kubevol plugins: No space left on device: /root/kubevol/pods/x.json"),
        (NotADirectoryError(20, "Not a directory"), 1, "kubevol plugins: Not a directory"),
        (AttributeError("'str' object has no attribute 'get'"), 70,
         "kubevol plugins: internal error: AttributeError: 'str' object has no attribute "
         "'get' (set KUBEVOL_DEBUG=1 for the traceback)"),
        (KubevolError("first\nsecond"), 1, "kubevol plugins: first; second"),
    ],
    ids=["full-disk", "os-error-without-path", "bug", "multi-line"],
)
def test_every_failure_ends_in_one_line_and_a_documented_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    error: Exception, code: int, line: str,
) -> None:
    """Whatever a command raises, the dispatcher prints one line and returns a code that
    ``kubevol --help`` documents (issue 20, point 10)."""

    def fail(args: object) -> int:
        raise error

    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    monkeypatch.setattr(plugins_cli, "run", fail)
    assert main(["plugins"]) == code
    assert capsys.readouterr().err.splitlines() == [line]
    assert f"\n  {code:<4} " in exits.EPILOG


def test_the_traceback_of_an_internal_error_is_there_on_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KUBEVOL_DEBUG=1 lets the exception through."""
    def fail(args: object) -> int:
        raise AttributeError("bug")

    monkeypatch.setenv(exits.DEBUG_ENV, "1")
    monkeypatch.setattr(plugins_cli, "run", fail)
    with pytest.raises(AttributeError, match="bug"):
        main(["plugins"])


# -- hostile metadata files ---------------------------------------------------------------------

HOSTILE_FILES = ("fifo", "link-to-dev-zero", "deep-json", "huge")


def plant(path: Path, kind: str) -> None:
    """A metadata file that hung, exhausted memory or crashed kubevol before."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "deep-json":
        path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    else:
        with open(path, "wb") as f:
            f.truncate(64 << 30)  # sparse: 64 GiB that read as zeros


@pytest.mark.slow
@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_hostile_vol_data_is_one_reported_volume(tmp_path: Path, kind: str) -> None:
    """A pod volume's vol_data.json (and a device mount's) that is a FIFO, a link to
    /dev/zero, 100,000-deep JSON or 64 GiB: status, reconstruct, mount-refs and down finish
    promptly, report that volume, and never fail the whole command (issue 20, point 5)."""
    root = tmp_path / "root"
    vol = root / "pods" / POD_UID / "volumes" / "kubernetes.io~csi" / "pv1"
    (vol / "mount").mkdir(parents=True)
    plant(vol / "vol_data.json", kind)
    device = root / "plugins" / "kubernetes.io" / "csi" / DRIVER_NAME / ("a" * 64)
    (device / "globalmount").mkdir(parents=True)
    plant(device / "vol_data.json", kind)
    flags = ("--root", str(root), "--node-name", "n1")
    status = run_kubevol("status", *flags, "--no-metrics", "-o", "json", timeout=60)
    assert status.returncode == 0, status.stderr
    assert '"unreadable"' in status.stdout
    found = run_kubevol("reconstruct", *flags, "-o", "json", timeout=60)
    assert found.returncode == 0, found.stderr
    assert "vol_data.json" in found.stdout
    refs = run_kubevol("mount-refs", "--root", str(root), str(device / "globalmount"),
                       timeout=60)
    assert "Traceback" not in refs.stderr and refs.returncode in (0, 1, 3), refs.stderr
    # Nothing is mounted: the volume directory holds only what a tear-down leaves.
    down = run_kubevol("down", *flags, "--timeout", "3", "--pod-uid", POD_UID, timeout=60)
    assert down.returncode in (0, 1) and "Traceback" not in down.stderr, down.stderr


# -- bad records ---------------------------------------------------------------------------------

EMPTYDIR_POD = (
    "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: {uid}}}\n"
    "spec:\n  containers: [{{name: c, image: x}}]\n"
    "  volumes: [{{name: scratch, emptyDir: {{}}}}]\n"
)
GOOD_UID = "44444444-5555-6666-7777-888888888888"
BAD_UID = "55555555-6666-7777-8888-999999999999"


@pytest.mark.root
@pytest.mark.parametrize("content", [b"", b"null", b'{"uid": 5}', b"[" * 100_000, b"\xff"])
def test_one_unreadable_record_blocks_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    """A corrupt record beside a good one: up, status and down of the good pod work and say
    which record was skipped; ``down`` of the bad one replaces it (issue 20, point 9)."""
    root = tmp_path / "root"
    flags = ["--root", str(root), "--node-name", "n1"]
    good = tmp_path / "good.yaml"
    good.write_text(EMPTYDIR_POD.format(name="good", uid=GOOD_UID))
    records = root / "kubevol" / "pods"
    records.mkdir(parents=True)
    (records / f"{BAD_UID}.json").write_bytes(content)
    assert main(["up", *flags, str(good)]) == 0
    assert f"{BAD_UID}" in capsys.readouterr().err
    assert main(["status", *flags, "--no-metrics"]) == 0
    out, err = capsys.readouterr()
    assert "good" in out and BAD_UID in err
    assert main(["down", *flags, "--pod-uid", GOOD_UID]) == 0
    assert f"{GOOD_UID}: gone" in capsys.readouterr().out
    assert main(["down", *flags, "--pod-uid", BAD_UID]) == 0
    assert f"{BAD_UID}: gone" in capsys.readouterr().out
    assert os.listdir(records) == []


@pytest.mark.root
def test_up_validates_every_pod_before_recording_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid pod and one with an invalid volume name and fsGroup in one manifest: exit 1,
    nothing recorded, nothing made; a later ``up`` of the valid pod alone works (before, the
    invalid pod was recorded and every later ``up`` failed)."""
    root = tmp_path / "root"
    flags = ["--root", str(root), "--node-name", "n1"]
    manifest = tmp_path / "pods.yaml"
    bad = EMPTYDIR_POD.format(name="bad", uid=BAD_UID).replace(
        "name: scratch", "name: Scratch_1"
    ).replace("spec:\n", "spec:\n  securityContext: {fsGroup: -1}\n")
    manifest.write_text(EMPTYDIR_POD.format(name="good", uid=GOOD_UID) + "---\n" + bad)
    assert main(["up", *flags, str(manifest)]) == 64  # a bad input file
    assert "pod default/bad: " in capsys.readouterr().err
    assert not (root / "pods").exists()
    assert not (root / "kubevol" / "pods").exists() or os.listdir(root / "kubevol" / "pods") == []
    good = tmp_path / "good.yaml"
    good.write_text(EMPTYDIR_POD.format(name="good", uid=GOOD_UID))
    assert main(["up", *flags, str(good)]) == 0
    assert main(["down", *flags, str(good)]) == 0


@pytest.mark.root
def test_a_hidden_pod_uid_is_refused_by_up_and_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A UID starting with "." was accepted by ``up`` (its record never read back) and
    ``down`` never finished: both refuse it now."""
    root = tmp_path / "root"
    flags = ["--root", str(root), "--node-name", "n1"]
    manifest = tmp_path / "hidden.yaml"
    manifest.write_text(EMPTYDIR_POD.format(name="hidden", uid=".hidden"))
    assert main(["up", *flags, str(manifest)]) == 64
    assert "must not start with '.'" in capsys.readouterr().err
    assert main(["down", *flags, "--pod-uid", ".hidden"]) == 64
    assert not (root / "pods").exists()


# -- tear-down with corrupt metadata or an unavailable driver ---------------------------------

def corrupt(path: Path, kind: str) -> None:
    """Nine ways a pod's vol_data.json goes bad (crash, disk, hand edit)."""
    data = json.loads(path.read_text())
    text = {
        "truncated": path.read_text()[: len(path.read_text()) // 2],
        "empty": "",
        "null": "null",
        "list": json.dumps(list(data.values())),
        "wrong-types": json.dumps(dict.fromkeys(data, 7)),
        "no-handle": json.dumps({k: v for k, v in data.items() if k != "volumeHandle"}),
        "no-driver": json.dumps({k: v for k, v in data.items() if k != "driverName"}),
        "other-handle": json.dumps({**data, "volumeHandle": "ghost"}),
        "binary": "\udcff\udcfe",
    }[kind]
    path.write_bytes(text.encode("utf-8", "surrogateescape"))


CORRUPTIONS = ("truncated", "empty", "null", "list", "wrong-types", "no-handle", "no-driver",
               "other-handle", "binary")


@pytest.mark.root
@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_volume_with_corrupt_metadata_is_torn_down_from_the_mount_table(
    tmp_path: Path, driver_proc: tuple[subprocess.Popen[bytes], str], kind: str
) -> None:
    """The pod's vol_data.json corrupted while the volume is published: ``down`` tears it
    down from what the mount table and the staging directory say (NodeUnpublish and
    NodeUnstage with the real handle), so nothing stays mounted, the driver forgets it and
    DeleteVolume works; before, ``down`` said "gone" while the staging mount stayed and
    DeleteVolume failed for ever (issue 20, point 4)."""
    _, endpoint = driver_proc
    root = tmp_path / "root"
    flags = ("--root", str(root), "--node-name", "n1")
    manifest = csi_pod(tmp_path, endpoint)
    up = run_kubevol("up", *flags, "--csi-driver", f"{DRIVER_NAME}={endpoint}", str(manifest))
    assert up.returncode == 0, up.stderr
    corrupt(root / "pods" / POD_UID / "volumes" / "kubernetes.io~csi" / "pv1" / "vol_data.json",
            kind)
    down = run_kubevol("down", *flags, "--timeout", "30", "--pod-uid", POD_UID)
    assert "Traceback" not in down.stderr
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"{POD_UID}: gone" in down.stdout
    assert mounts_under(root) == []
    with CSIClient(endpoint) as client:
        handle = client.list_volumes().entries[0].volume.volume_id
        client.delete_volume(handle)


@pytest.mark.root
def test_a_block_volume_keeps_its_device_link_until_node_unpublish_succeeded(
    tmp_path: Path, driver_proc: tuple[subprocess.Popen[bytes], str]
) -> None:
    """``down`` of a CSI block volume while the driver does not answer: the pod's device
    link stays (what tells the next run to unpublish), exit 1; once the driver answers,
    ``down`` unpublishes, unstages and leaves nothing mounted (issue 20, point 4)."""
    proc, endpoint = driver_proc
    root = tmp_path / "root"
    flags = ("--root", str(root), "--node-name", "n1")
    manifest = csi_pod(tmp_path, endpoint, block=True)
    up = run_kubevol("up", *flags, "--csi-driver", f"{DRIVER_NAME}={endpoint}", str(manifest))
    assert up.returncode == 0, up.stderr
    link = root / "pods" / POD_UID / "volumeDevices" / "kubernetes.io~csi" / "pv1"
    assert link.is_symlink()
    proc.send_signal(signal.SIGSTOP)
    try:
        down = run_kubevol("down", *flags, "--timeout", "3", "--pod-uid", POD_UID)
        assert down.returncode == 1, down.stdout + down.stderr
        assert link.is_symlink()
        assert mounts_under(root) != []
    finally:
        proc.send_signal(signal.SIGCONT)
    down = run_kubevol("down", *flags, "--timeout", "30", "--pod-uid", POD_UID)
    assert down.returncode == 0, down.stdout + down.stderr
    assert mounts_under(root) == []
    assert not link.exists()


@pytest.mark.root
def test_status_timeout_bounds_metrics_of_a_stopped_driver(
    tmp_path: Path, driver_proc: tuple[subprocess.Popen[bytes], str]
) -> None:
    """``status --timeout 3`` with a SIGSTOPped driver: done in time, the CSI volume's usage
    unknown with a reason, exit 0 (before: 60 s per CSI volume, no way to bound it)."""
    proc, endpoint = driver_proc
    root = tmp_path / "root"
    flags = ("--root", str(root), "--node-name", "n1")
    manifest = csi_pod(tmp_path, endpoint)
    up = run_kubevol("up", *flags, "--csi-driver", f"{DRIVER_NAME}={endpoint}", str(manifest))
    assert up.returncode == 0, up.stderr
    proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        status = run_kubevol("status", *flags, "--timeout", "3", "-o", "json")
        elapsed = time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGCONT)
    assert status.returncode == 0, status.stderr
    [row] = [r for r in json.loads(status.stdout) if r["plugin"] == "kubernetes.io/csi"]
    assert row["used"] is None and row["metrics_error"]
    assert elapsed < 3 + STARTUP_SLACK, f"status --timeout 3 took {elapsed:.1f} s"
    assert run_kubevol("down", *flags, "--pod-uid", POD_UID).returncode == 0
