"""Covers kubevol.csidriver.sanity.coverage and kubevol.csidriver.sanity.__main__.

The suite's coverage table names real tests, and the csi-sanity-style command line
(``python -m kubevol.csidriver.sanity``) works."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kubevol.csidriver.sanity
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver
from kubevol.csidriver.sanity.__main__ import translate
from kubevol.csidriver.sanity.coverage import SPECS

SUITE = Path(kubevol.csidriver.sanity.__file__).parent


def suite_tests() -> set[str]:
    """The names of the suite's test functions."""
    names: set[str] = set()
    for module in SUITE.glob("test_*.py"):
        tree = ast.parse(module.read_text())
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        names |= {f.name for f in functions if f.name.startswith("test_")}
    return names


def test_every_csi_sanity_spec_is_covered_or_explained() -> None:
    """Each spec names an existing test or says why there is none; none is listed twice."""
    tests = suite_tests()
    for spec in SPECS:
        assert spec.test or spec.reason, f"{spec.spec}: neither a test nor a reason"
        if spec.test:
            assert spec.test in tests, f"{spec.spec}: no test {spec.test}"
    assert len({s.spec for s in SPECS}) == len(SPECS)
    assert len(SPECS) >= 90


def test_csi_sanity_flags_are_translated() -> None:
    """csi-sanity's flags (one or two dashes, with or without =) become the suite's
    options; pytest's own arguments pass through; unknown --csi. flags are refused."""
    assert translate(
        ["-csi.endpoint=unix:///x.sock", "--csi.mountdir", "/m", "--csi.testnodevolumeattachlimit",
         "-k", "identity"]
    ) == ["--csi-endpoint=unix:///x.sock", "--csi-mount-dir=/m",
          "--csi-test-node-volume-attach-limit", "-k", "identity"]  # fmt: skip
    assert translate(["--csi.testnodevolumeattachlimit=false"]) == []
    with pytest.raises(ValueError, match="unknown flag"):
        translate(["--csi.nosuchflag", "x"])


@pytest.mark.slow
def test_version_flag(tmp_path: Path) -> None:
    """``--version`` (csi-sanity's) and ``--csi-version`` (the pytest option) print the
    suite's version."""
    for cmd in (
        [sys.executable, "-m", "kubevol.csidriver.sanity", "--version"],
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--csi-version"],
    ):
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)
        assert proc.returncode == 0 and proc.stdout.startswith("kubevol.csidriver.sanity "), proc


@pytest.mark.slow
def test_runner_with_csi_sanity_flags_and_path_commands(tmp_path: Path) -> None:
    """The runner, given csi-sanity's flags and its path commands (scripts that create,
    check and remove directories, printing what csi-sanity's commands print), runs the
    suite against the mock; the commands are really used."""
    log = tmp_path / "calls.log"
    tools = tmp_path / "tools"
    tools.mkdir()
    scripts = {
        "mk": 'mkdir -p "$1/made"; echo "$1/made"',
        "rm": 'rm -rf "$1"',
        "check": 'if [ -d "$1" ]; then echo directory; elif [ -e "$1" ]; then echo file; '
        "else echo not_found; fi",
    }
    for name, body in scripts.items():
        path = tools / name
        path.write_text(f'#!/bin/sh\necho "{name} $1" >> {log}\n{body}\n')
        path.chmod(0o755)
    with MockDriver(MockConfig(node_id="node-1")).serve() as running:
        proc = subprocess.run(
            [sys.executable, "-m", "kubevol.csidriver.sanity", f"--csi.endpoint={running.endpoint}",
             "--csi.mountdir", str(tmp_path / "mnt"), "--csi.stagingdir", str(tmp_path / "stg"),
             "--csi.createmountpathcmd", str(tools / "mk"),
             "--csi.createstagingpathcmd", str(tools / "mk"),
             "--csi.removemountpathcmd", str(tools / "rm"),
             "--csi.removestagingpathcmd", str(tools / "rm"),
             "--csi.checkpathcmd", str(tools / "check"),
             "-p", "no:cacheprovider", "-q", "-k", "lifecycle or removes_the_target"],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().split()
    assert {"mk", "rm", "check"} <= set(calls)
    assert "/made/target" in log.read_text()
