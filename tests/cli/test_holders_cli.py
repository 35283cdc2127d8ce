"""Covers kubevol.node.holders in kubevol.cli.down and in the repair (kubevol.node.plan).

The last line of defence from the command line: ``kubevol down`` and ``reconstruct
--repair`` refuse to tear down a pod volume that a process or another mount namespace still
holds, name the holder, leave the volume as it is, and go on once it is released. Real
mounts, the bundled hostpath CSI driver, real processes and namespaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.testing.mount_rig import mounts_under
from tests.cli.test_node_cli import (
    UID,
    create_volume,
    driver,  # noqa: F401 - the fixture
    write_manifest,
)

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

_HOLD_OPEN = (
    "import sys, time; f = open(sys.argv[1], 'rb'); print('ready', flush=True); time.sleep(600)"
)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; each killed by its PID and reaped afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _spawn(children: list[subprocess.Popen[str]], argv: list[str], cwd: str | None = None
           ) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=cwd)
    children.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


class Pod:
    """The test pod of test_node_cli, up: a CSI volume, a memory emptyDir, a hostPath."""

    def __init__(self, tmp_path: Path, running: RunningDriver) -> None:
        self.manifest = write_manifest(tmp_path, create_volume(running))
        self.root = str(tmp_path / "root")
        self.flags = ["--root", self.root, "--node-name", "n1"]
        self.pod_dir = f"{self.root}/pods/{UID}"
        self.cache = f"{self.pod_dir}/volumes/kubernetes.io~empty-dir/cache"
        self.data = f"{self.pod_dir}/volumes/kubernetes.io~csi/pv1/mount"
        assert main(["up", *self.flags, "--csi-driver", f"{DRIVER_NAME}={running.endpoint}",
                     str(self.manifest)]) == 0
        os.makedirs(f"{self.cache}/work")
        Path(f"{self.cache}/work/note").write_text("cache data")
        Path(f"{self.data}/db").write_text("csi data")

    def down(self, *extra: str) -> int:
        return main(["down", *self.flags, "--timeout", "20s", *extra, str(self.manifest)])

    def intact(self) -> bool:
        return (Path(f"{self.cache}/work/note").read_text() == "cache data"
                and Path(f"{self.data}/db").read_text() == "csi data")


@pytest.fixture
def pod(tmp_path: Path, driver: RunningDriver) -> Pod:  # noqa: F811 - the fixture
    return Pod(tmp_path, driver)


def test_down_refuses_volumes_a_process_holds_names_it_and_goes_on_once_released(
    tmp_path: Path, pod: Pod, children: list[subprocess.Popen[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ``sleep`` working in the emptyDir and a process with a file open in the CSI
    volume: ``down`` exits 1 naming both PIDs, every mount and file stays; once they
    exit, ``down`` takes the pod away."""
    sleeper = _spawn(children, ["sh", "-c", "echo ready; exec sleep 600"],
                     cwd=f"{pod.cache}/work")
    reader = _spawn(children, [sys.executable, "-c", _HOLD_OPEN, f"{pod.data}/db"])
    before = mounts_under(tmp_path)
    capsys.readouterr()
    assert pod.down() == 1
    captured = capsys.readouterr()
    assert f"{UID}: still being torn down" in captured.out
    assert f"process {sleeper.pid} (sleep) has its working directory {pod.cache}/work" \
        in captured.err
    assert f"process {reader.pid} (" in captured.err and f"{pod.data}/db" in captured.err
    assert mounts_under(tmp_path) == before
    assert pod.intact()
    _stop(sleeper)
    _stop(reader)
    assert pod.down() == 0
    assert f"{UID}: gone" in capsys.readouterr().out
    assert mounts_under(tmp_path) == []
    assert not os.path.exists(pod.pod_dir)


def test_down_refuses_a_volume_another_mount_namespace_has_a_mount_below(
    tmp_path: Path, pod: Pod, children: list[subprocess.Popen[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A child in its own (private) mount namespace mounts a tmpfs below the emptyDir that
    this namespace does not see: ``down`` refuses that volume naming the namespace, and
    leaves it; once the namespace is gone, ``down`` completes."""
    other = _spawn(children, [
        "unshare", "-m", "--propagation=private", "sh", "-c",
        f"mount -t tmpfs none {pod.cache}/work && echo ready && exec sleep 600",
    ])
    ns = os.stat(f"/proc/{other.pid}/ns/mnt").st_ino
    capsys.readouterr()
    assert pod.down() == 1
    err = capsys.readouterr().err
    assert f"mount namespace mnt:[{ns}] (process {other.pid} (" in err
    assert pod.intact()
    assert os.path.ismount(pod.cache)
    _stop(other)
    assert pod.down() == 0
    assert mounts_under(tmp_path) == []


def test_repair_plan_shows_the_refusal_and_the_repair_keeps_the_volume(
    tmp_path: Path, pod: Pod, children: list[subprocess.Popen[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the pod named gone and a process working in its emptyDir, the dry run marks
    that volume's actions (and the pod directory's removal) refused with the PID, the other
    volume's not; the repair then tears down only the free volume."""
    os.unlink(f"{pod.root}/kubevol/pods/{UID}.json")
    sleeper = _spawn(children, ["sh", "-c", "echo ready; exec sleep 600"],
                     cwd=f"{pod.cache}/work")
    capsys.readouterr()
    assert main(["reconstruct", *pod.flags, "--repair", "--dry-run", "--pod-gone", UID,
                 "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    refused = {(a["action"], a["volume"]) for a in plan["actions"] if a["refused"]}
    free = {(a["action"], a["volume"]) for a in plan["actions"] if not a["refused"]}
    assert refused == {("unmount", "cache"), ("remove dir", "cache"), ("remove pod dir", "")}
    assert ("unmount", "pv1") in free and ("remove dir", "pv1") in free
    [dir_action] = [a for a in plan["actions"] if a["action"] == "remove dir"
                    and a["volume"] == "cache"]
    assert f"process {sleeper.pid} (sleep)" in dir_action["refused"]
    assert main(["reconstruct", *pod.flags, "--repair", "--pod-gone", UID,
                 "--timeout", "20s", "-o", "json"]) == 1
    assert os.path.ismount(pod.cache) and not os.path.exists(pod.data)
    assert Path(f"{pod.cache}/work/note").read_text() == "cache data"
    _stop(sleeper)
    capsys.readouterr()
    assert main(["reconstruct", *pod.flags, "--repair", "--pod-gone", UID,
                 "--timeout", "20s", "-o", "json"]) == 0
    assert mounts_under(tmp_path) == []
    assert not os.path.exists(pod.pod_dir)
