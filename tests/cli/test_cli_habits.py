"""Covers kubevol.cli.main, kubevol.cli.completion, kubevol.cli.csi_drivers, kubevol.cli.agent.

kubectl's habits and the operator's: ``--version`` with the git commit (a build records
it), ``-v`` after the command, shell completion generated from the parser, remembered CSI
drivers listed and forgotten (a bad one never remembered), ``down`` that exits 1 when a
volume is left staged, and the agent waiting for a static pod directory that does not
exist yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import build_parser, main
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.testing.mount_rig import mounts_under
from kubevol.util.buildinfo import checkout_commit
from tests.cli.test_node_cli import UID, create_volume, write_manifest

REPO = Path(__file__).resolve().parents[2]
KUBEVOL = [sys.executable, "-m", "kubevol.cli.main"]


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[RunningDriver]:
    """The hostpath driver served in-process; everything under tmp_path unmounted after."""
    running = HostPathDriver(HostPathConfig(state_dir=str(tmp_path / "hp"), node_id="n1")).serve()
    try:
        yield running
    finally:
        for point in reversed(mounts_under(tmp_path)):
            subprocess.run(["umount", "-l", point], check=False)
        running.stop()


def test_version_names_the_version_and_the_commit() -> None:
    """``kubevol --version`` prints the version and the checkout's commit, and exits 0."""
    import kubevol

    done = subprocess.run([*KUBEVOL, "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    commit = checkout_commit()
    assert len(commit) == 40
    assert done.stdout.strip() == f"kubevol {kubevol.__version__} (git commit {commit})"


@pytest.mark.root
def test_a_build_records_the_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setup.py's build_py and sdist (a wheel's and an sdist's build) record the commit:
    the package copied away from the checkout still names it."""
    import runpy
    import shutil

    given: dict[str, object] = {}
    monkeypatch.setattr("setuptools.setup", lambda **kwargs: given.update(kwargs))
    hooks = runpy.run_path(str(REPO / "setup.py"))
    cmdclass = given["cmdclass"]
    assert isinstance(cmdclass, dict)
    assert cmdclass["build_py"].__name__ == "BuildPyRecordingTheCommit"
    assert cmdclass["sdist"].__name__ == "SdistRecordingTheCommit"
    lib = tmp_path / "lib"
    shutil.copytree(REPO / "kubevol", lib / "kubevol",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    hooks["_write_build_info"](str(lib))
    info = json.loads((lib / "kubevol" / "_buildinfo.json").read_text())
    assert info["git_commit"] == checkout_commit() and info["build_date"]
    done = subprocess.run(
        [sys.executable, "-c", "from kubevol.util.buildinfo import git_commit as g; print(g())"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(lib)},
        capture_output=True, text=True, check=True)
    assert done.stdout.strip() == checkout_commit()


def test_logging_flags_after_the_command() -> None:
    """``-v`` and ``--log-format`` are taken after the command (and its sub-commands) too;
    a command's own -v (driver serve's --debug) keeps it and --v works there."""
    args = build_parser(["status"]).parse_args(["status", "-v", "3", "--log-format", "json"])
    assert (args.verbosity, args.log_format) == (3, "json")
    args = build_parser(["-v", "2", "status"]).parse_args(["-v", "2", "status"])
    assert args.verbosity == 2
    argv = ["driver", "serve", "hostpath", "-v", "--v", "5"]
    args = build_parser(argv).parse_args(argv)
    assert args.debug is True and args.verbosity == 5


@pytest.mark.slow
def test_bash_completion_comes_from_the_parser(tmp_path: Path) -> None:
    """The bash script completes the commands and a command's flags, as bash runs it."""
    done = subprocess.run([*KUBEVOL, "completion", "bash"], capture_output=True, text=True,
                          check=True)
    script = tmp_path / "kubevol.bash"
    script.write_text(done.stdout)

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        probe = (f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
                 f"COMP_CWORD={len(words) - 1}; COMP_LINE={line!r}; COMP_POINT={len(line)}; "
                 "_shtab_kubevol; printf '%s\\n' \"${COMPREPLY[@]}\"")
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                             check=True).stdout
        return out.split()

    assert "reconstruct" in complete("kubevol rec")
    assert "csi-drivers" in complete("kubevol csi-")
    assert "--ignore-not-found" in complete("kubevol down --ign")
    zsh = subprocess.run([*KUBEVOL, "completion", "zsh"], capture_output=True, text=True,
                         check=True).stdout
    assert "#compdef kubevol" in zsh and "reconstruct" in zsh


def test_a_driver_that_does_not_answer_is_not_remembered_and_drivers_are_forgotten(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad --csi-driver is refused (exit 1, saying what to do) and never saved; a good
    one is remembered, listed as answering, and forgotten by name."""
    root = tmp_path / "root"
    (root / "pods").mkdir(parents=True)
    r = ["--root", str(root)]
    assert main(["status", *r, "--no-metrics", "--csi-driver",
                 f"bad.example.com=unix://{tmp_path}/absent.sock"]) == exits.FAILED
    assert "start the driver or correct the endpoint" in capsys.readouterr().err
    assert main(["status", *r, "--no-metrics", "--csi-driver",
                 f"{DRIVER_NAME}={driver.endpoint}"]) == exits.OK
    capsys.readouterr()
    assert main(["csi-drivers", "list", *r, "-o", "json"]) == exits.OK
    rows = json.loads(capsys.readouterr().out)
    assert [(d["name"], d["endpoint"], d["state"], d["node_id"]) for d in rows] == [
        (DRIVER_NAME, driver.endpoint, "answering", "n1")]
    assert main(["csi-drivers", "forget", *r, "nosuch.example.com"]) == exits.FAILED
    assert "not remembered" in capsys.readouterr().err
    assert main(["csi-drivers", "forget", *r, DRIVER_NAME]) == exits.OK
    assert json.loads((root / "kubevol" / "csi-drivers.json").read_text()) == {}


@pytest.mark.root
def test_down_exits_1_naming_a_volume_left_staged(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod whose volume cannot be unstaged (a process works in its staging mount, so the
    unstage guard refuses) is not done: down exits 1 and -o json says which and why."""
    manifest = write_manifest(tmp_path, create_volume(driver))
    flags = ["--root", str(tmp_path / "root"), "--node-name", "n1"]
    assert main(["up", *flags, "--csi-driver", f"{DRIVER_NAME}={driver.endpoint}",
                 str(manifest)]) == exits.OK
    staging = next(m for m in mounts_under(tmp_path) if m.endswith("/globalmount"))
    holder = subprocess.Popen(["sleep", "120"], cwd=staging)
    try:
        capsys.readouterr()
        code = main(["down", *flags, "--timeout", "8s", "-o", "json", str(manifest)])
        data = json.loads(capsys.readouterr().out)
    finally:
        holder.kill()
        holder.wait()
    assert code == exits.FAILED, data
    assert data["not_done"] is not None and data["not_done"]["failures"], data
    assert any(DRIVER_NAME in f["key"] for f in data["not_done"]["failures"]), data
    # The pod is gone; its staging, left behind, is an orphan a repair unstages.
    assert main(["reconstruct", *flags, "--repair"]) == exits.OK
    assert mounts_under(tmp_path) == []


@pytest.mark.root
def test_the_agent_waits_for_a_static_pod_directory(tmp_path: Path) -> None:
    """A --manifests directory that does not exist yet is waited for (the agent runs, as
    the kubelet does); once it appears, its pods are run."""
    manifests = tmp_path / "manifests"
    root = tmp_path / "root"
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        agent = subprocess.Popen(
            [*KUBEVOL, "agent", "--root", str(root), "--manifests", str(manifests),
             "--metrics-address", "", "--plugins-registry", ""],
            stderr=stderr, stdout=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 60
        while "does not exist yet" not in err.read_text():
            assert agent.poll() is None, err.read_text()
            assert time.monotonic() < end, err.read_text()
            time.sleep(0.1)
        manifests.mkdir()
        (manifests / "pod.yaml").write_text(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: " + UID + "}\n"
            "spec:\n  containers: [{name: c, image: x}]\n"
            "  volumes: [{name: scratch, emptyDir: {}}]\n")
        volume = root / "pods" / UID / "volumes" / "kubernetes.io~empty-dir" / "scratch"
        while not volume.is_dir():
            assert agent.poll() is None, err.read_text()
            assert time.monotonic() < end, err.read_text()
            time.sleep(0.1)
    finally:
        agent.terminate()
        assert agent.wait(timeout=30) == 0, err.read_text()


def test_the_readme_lists_the_one_vocabulary_of_states() -> None:
    """The README's paragraph on volume states names each word of VOLUME_STATES."""
    from kubevol.cli.node_common import VOLUME_STATES

    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("A volume's state is one word")
    paragraph = text[start:text.index("\n\n", start)]
    for word in VOLUME_STATES:
        assert f"`{word}`" in paragraph, word


def test_the_agents_metrics_default_to_no_kubelet_port() -> None:
    """The agent's default /metrics address is on loopback, on none of the kubelet's or
    kube-proxy's ports (10255 was the kubelet's read-only port)."""
    from kubevol.cli.agent import DEFAULT_METRICS_ADDRESS, KUBELET_PORTS

    host, _, port = DEFAULT_METRICS_ADDRESS.rpartition(":")
    assert host == "127.0.0.1" and int(port) not in KUBELET_PORTS
    assert {10250, 10255} <= KUBELET_PORTS


@pytest.mark.root
def test_a_long_wait_says_on_a_terminal_what_it_waits_for(tmp_path: Path) -> None:
    """``up`` of a volume whose CSI driver is not there says, on a terminal, every few
    seconds what it waits for and why, and its final error says to give --csi-driver."""
    import pty

    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: " + UID + "}\n"
        "spec:\n  containers: [{name: c, image: x}]\n"
        "  volumes: [{name: v, csi: {driver: absent.example.com}}]\n")
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*KUBEVOL, "up", "--root", str(tmp_path / "root"), "--timeout", "7s",
             str(manifest)], stdout=subprocess.DEVNULL, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=60)
    finally:
        os.close(leader)
    text = b"".join(chunks).decode()
    assert code == exits.FAILED, text
    assert "still mounting after" in text and "left of --timeout" in text, text
    assert "not found in the list of registered CSI drivers" in text, text
    assert text.count("--csi-driver NAME=ENDPOINT") >= 2, text  # progress and final report
