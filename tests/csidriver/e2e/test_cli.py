"""Covers kubevol.testing.e2e through ``kubevol driver e2e`` and kubevol.testing.e2e.plugin.

``kubevol driver e2e`` and the pytest plugin: exit codes, the report, the driver command
that the restart check needs."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.testing.e2e import CHECKS
from tests.csidriver.e2e.drivers import hostpath
from tests.csidriver.e2e.test_broken_drivers import MountsNothingBackend

pytestmark = pytest.mark.root


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail("the e2e suite needs root (real mounts)")
    return tmp_path


def test_passing_checks_exit_0(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Against the hostpath driver the chosen checks pass: exit 0, one line per check."""
    for driver in hostpath(tmp):
        code = main(["driver", "e2e", "--endpoint", driver.endpoint, "--csi.testvolumesize",
                     "16Mi", "-k", "store-data or block-io"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED  volumes/store-data" in out and "PASSED  volumemode/block-io" in out
    assert "2 passed, 0 failed, 0 skipped" in out


def test_a_failing_check_exits_1_with_the_report(
    tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken driver: exit 1, and the report names the upstream test, what was expected,
    and the calls the kubelet made with the driver's answers."""
    for driver in hostpath(tmp, backend=MountsNothingBackend):
        code = main(["driver", "e2e", "--endpoint", driver.endpoint, "--csi.testvolumesize",
                     "16Mi", "-k", "store-data"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED  volumes/store-data" in out
    assert "volumes.go: should store data" in out
    assert "expected: the volume mounted at the path the kubelet gave NodePublishVolume" in out
    assert "NodePublishVolume(volume_id:" in out and "-> {}" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["driver", "e2e"],  # no endpoint
        ["driver", "e2e", "--endpoint", "unix:///nowhere.sock", "-k", "not"],
        ["driver", "e2e", "--endpoint", "unix:///nowhere.sock", "--csi.secrets", "/no/such"],
        ["driver", "e2e", "--endpoint", "unix:///nowhere.sock", "--csidriver", "/no/such"],
    ],
)
def test_usage_errors_exit_64(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint, a bad -k expression or an unreadable input file (secrets, the CSIDriver
    object): exit 64."""
    monkeypatch.delenv("CSI_ENDPOINT", raising=False)
    assert main(argv) == 64


def test_list_names_every_check_and_its_upstream_test(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--list prints each check with the upstream test it mirrors."""
    assert main(["driver", "e2e", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [c.name for c in CHECKS]
    assert all("test/e2e/storage/" in line for line in lines)


def test_the_driver_command_runs_the_restart_check(tmp: Path) -> None:
    """With --driver-command the suite starts the driver and restarts it for the driver
    restart check, which then runs (and passes against the hostpath driver)."""
    state = tmp / "hp"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(state)], check=True)
    sock = tmp / "csi.sock"
    kubevol = [sys.executable, "-m", "kubevol.cli.main"]
    command = " ".join([*kubevol, "driver", "serve", "hostpath", "--endpoint",
                        f"unix://{sock}", "--state-dir", str(state), "--node-id", "n1"])
    try:
        done = subprocess.run(
            [*kubevol, "driver", "e2e", "--endpoint", f"unix://{sock}", "--csi.testvolumesize",
             "16Mi", "-k", "driver-restart", "--driver-command", f"exec {command}"],
            capture_output=True, text=True, timeout=120, check=False)
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED  disruptive/driver-restart" in done.stdout


def test_the_pytest_plugin_runs_the_checks(tmp: Path) -> None:
    """``pytest --pyargs kubevol.testing.e2e --e2e-endpoint ...`` runs a test per check."""
    installed = any(e.name == "kubevol-e2e" for e in entry_points(group="pytest11"))
    load = [] if installed else ["-p", "kubevol.testing.e2e.plugin"]
    for driver in hostpath(tmp):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *load, "-p", "no:cacheprovider", "-q",
             "--pyargs", "kubevol.testing.e2e", "--e2e-endpoint",
             driver.endpoint, "--e2e-volume-size", "16Mi",
             "-k", "store or directory or subpathexpr"],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_the_csidriver_object_turns_the_selinux_check_on(
    tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--csidriver FILE gives the driver's CSIDriver object: with seLinuxMount the SELinux
    check runs (and passes against hostpath); a CSIDriver with an unknown fsGroupPolicy is
    a usage error naming it."""
    good, bad = tmp / "csidriver.yaml", tmp / "bad.yaml"
    good.write_text("apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata:\n"
                    "  name: hostpath.csi.kubevol.io\nspec:\n  attachRequired: false\n"
                    "  seLinuxMount: true\n", encoding="utf-8")
    bad.write_text("kind: CSIDriver\nmetadata: {name: x}\nspec: {fsGroupPolicy: Sometimes}\n",
                   encoding="utf-8")
    for driver in hostpath(tmp):
        code = main(["driver", "e2e", "--endpoint", driver.endpoint, "--csi.testvolumesize",
                     "16Mi", "--csidriver", str(good), "-k", "selinuxmount"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "PASSED  selinuxmount/context-mount-option" in out
        assert main(["driver", "e2e", "--endpoint", driver.endpoint,
                     "--csidriver", str(bad)]) == 64
    assert "Sometimes" in capsys.readouterr().err
