"""Covers kubevol.csidriver.server.bootstrap and kubevol.csidriver.sanity.plugin.

The conformance loop of a driver author, on a project ``kubevol driver new`` wrote with a
64 MiB limit: its own test asks the suite for volumes it can hold and passes; a failure
names the test, the rule and the reason in its first lines; the driver logs its start;
``python -m kubevol.csidriver.sanity --help`` starts with the CSI options; the README and
the manifests say how to test as root and deploy with node-driver-registrar."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubevol.cli.main import main
from kubevol.csidriver.sanity.plugin import OPTIONS
from kubevol.csidriver.server.bootstrap import BootstrapError, write_project
from tests.csi.support import wait_for_socket

MiB = 1 << 20


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "acme-csi"
    code = main(["driver", "new", "acme-csi", "--output", str(project),
                 "--max-volume-size", "64Mi"])  # fmt: skip
    assert code == 0
    return project


def _env(project: Path) -> dict[str, str]:
    """This interpreter's environment with the project importable, as `pip install -e`
    would make it (kubevol is installed in it already)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CSI_", "X_CSI"))}
    return {**clean, "PYTHONPATH": str(project)}


def _pytest(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project, env=_env(project), capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_a_64mib_driver_passes_its_own_test(tmp_path: Path) -> None:
    """The generated driver holds at most 64 MiB per volume, and its test passes: it asks
    the suite for volumes of that size (the suite's own default, 10 GiB, would fail)."""
    project = _project(tmp_path)
    assert "MAX_VOLUME_BYTES = 67108864" in (project / "acme_csi/__init__.py").read_text()
    run = _pytest(project)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


@pytest.mark.slow
def test_a_failure_says_which_test_failed_and_why_first(tmp_path: Path) -> None:
    """With the suite's 10 GiB default instead of the driver's size, the project's test
    fails, and the first lines of its failure name the failed suite tests, the rule each
    checks and the driver's answer, and the file with the whole output."""
    project = _project(tmp_path)
    test = project / "tests/test_sanity.py"
    test.write_text(test.read_text().replace("volume_size=MAX_VOLUME_BYTES", "volume_size=None"))
    run = _pytest(project)
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "test_passes_the_conformance_suite _" in line)
    head = lines[start + 1 : start + 5]
    assert head[0].startswith("CSI conformance: ") and " tests failed" in head[0], head
    assert head[1].startswith("- test_") and ".py::test_" in head[1], head
    assert head[2].startswith("    checks: ") and head[2].endswith("."), head
    assert head[3].startswith("    failed: ") and "OUT_OF_RANGE" in head[3], head
    log = next(line for line in lines if "whole output: " in line).split("whole output: ")[1]
    assert Path(log).is_file() and "FAILED" in Path(log).read_text()


def test_the_generated_driver_logs_its_start(tmp_path: Path) -> None:
    """The project's console script, started with only CSI_ENDPOINT, says on stderr which
    driver serves where (before: nothing below WARNING)."""
    project = _project(tmp_path)
    sock = tmp_path / "csi.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "acme_csi.main"],
        env={**_env(project), "CSI_ENDPOINT": f"unix://{sock}"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for_socket(sock, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=30)[1].decode()
    assert proc.returncode == 0, err
    assert f"serving acme-csi.csi.example.com (controller and node) on unix://{sock}" in err


def test_sanity_help_starts_with_the_csi_options() -> None:
    """``python -m kubevol.csidriver.sanity --help`` is the usage and the CSI options (each
    under its csi-sanity spelling too), not pytest's 400 lines."""
    out = subprocess.run(
        [sys.executable, "-m", "kubevol.csidriver.sanity", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.splitlines()
    assert lines[0].startswith("usage: python -m kubevol.csidriver.sanity --csi.endpoint")
    assert any("--csi.endpoint, --csi-endpoint" in line for line in lines[:10])
    assert "--csi.testvolumesize, --csi-volume-size" in out
    for flag, _ in OPTIONS:
        assert flag in out, flag
    assert len(lines) < 100 and "--rootdir" not in out  # pytest's own options are not listed


def test_the_readme_and_manifests_say_how_to_test_and_deploy(tmp_path: Path) -> None:
    """The README says how to run the tests as root in a private mount namespace and how to
    deploy; the DaemonSet runs node-driver-registrar with the driver's socket as the pod
    (--csi-address) and as the kubelet (--kubelet-registration-path) see it, and the
    kubelet's plugins_registry mounted at /registration."""
    project = _project(tmp_path)
    readme = (project / "README.md").read_text()
    assert "unshare -m --propagation private" in readme
    assert "node-driver-registrar" in readme and "deploy/kubernetes/node.yaml" in readme
    daemonset: Any = yaml.safe_load((project / "deploy/kubernetes/node.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    registrar = containers["node-driver-registrar"]
    host_dir = "/var/lib/kubelet/plugins/acme-csi.csi.example.com"
    assert "--csi-address=/csi/csi.sock" in registrar["args"]
    assert f"--kubelet-registration-path={host_dir}/csi.sock" in registrar["args"]
    mounts = {m["mountPath"]: m["name"] for m in registrar["volumeMounts"]}
    assert volumes[mounts["/registration"]] == "/var/lib/kubelet/plugins_registry"
    assert volumes[mounts["/csi"]] == host_dir
    driver = containers["driver"]
    env = {e["name"]: e.get("value") for e in driver["env"]}
    assert env["CSI_ENDPOINT"] == "unix:///csi/csi.sock" and env["X_CSI_MODE"] == "node"
    pods = next(m for m in driver["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pods")
    assert pods["mountPropagation"] == "Bidirectional"
    csidriver: Any = yaml.safe_load((project / "deploy/kubernetes/csidriver.yaml").read_text())
    assert csidriver["metadata"]["name"] == "acme-csi.csi.example.com"


def test_a_volume_size_below_one_mebibyte_is_refused(tmp_path: Path) -> None:
    """A largest volume under 1 MiB is refused before anything is written."""
    with pytest.raises(BootstrapError, match="1Mi"):
        write_project("acme-csi", str(tmp_path / "p"), max_volume_bytes=MiB - 1)
    assert not (tmp_path / "p").exists()
