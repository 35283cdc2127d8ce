"""Covers kubevol.csidriver.sanity on the bundled drivers (mock, hostpath).

The bundled drivers pass the conformance suite in every mode (mock mount and block;
hostpath mount, block and shared-filesystem, on real mounts and loop devices); the suite's
own command-line behaviour."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from kubevol.csi import types as t
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver
from kubevol.mount.mountinfo import parse_mountinfo
from tests.csidriver.sanity.suite import SuiteResult, run_suite

#: Tests the hostpath driver's capabilities skip: GetSnapshot (opt-in, unknown to upstream
#: csi-sanity) and ControllerModifyVolume (not offered).
HOSTPATH_SKIPS = frozenset(
    {
        "test_get_snapshot",
        "test_controller_modify_volume",
        "test_create_volume_with_volume_attributes_class",
    }
)


def assert_clean(result: SuiteResult, allowed_skips: frozenset[str] = frozenset()) -> None:
    """No failure, no skip beyond ``allowed_skips``, and a plausible number of passes."""
    assert result.exit_code == 0 and not result.failed, result.describe()
    assert result.skipped <= allowed_skips, result.describe()
    assert len(result.passed) >= 50, result.describe()


def no_mounts_under(base: Path) -> bool:
    """Whether nothing is mounted below ``base``."""
    prefix = str(base) + "/"
    return not any(e.mount_point.startswith(prefix) for e in parse_mountinfo())


def loops_under(base: Path) -> str:
    """losetup's lines for images below ``base``."""
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return "".join(line for line in out.splitlines(keepends=True) if str(base) in line)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("access_type", "get_snapshot"), [("mount", False), ("block", True)], ids=["mount", "block"]
)
def test_mock_passes(tmp_path: Path, access_type: str, get_snapshot: bool) -> None:
    """The mock (real target paths, an attach limit) passes every test of the suite; with
    its default capabilities only GetSnapshot's test is skipped, with GET_SNAPSHOT turned
    on nothing is."""
    params = tmp_path / "mutable.yaml"
    params.write_text("iops: '100'\n")
    config = MockConfig(node_id="node-1", attach_limit=3)
    if get_snapshot:
        caps = config.controller_caps | {t.ControllerCapability.GET_SNAPSHOT}
        config = attrs.evolve(config, controller_caps=caps)
    with MockDriver(config).serve() as running:
        result = run_suite(
            running.endpoint,
            tmp_path / "suite",
            "--csi-access-type", access_type,
            "--csi-mutable-params-file", str(params),
            "--csi-test-node-volume-attach-limit",
        )  # fmt: skip
    assert_clean(result, frozenset() if get_snapshot else frozenset({"test_get_snapshot"}))


@pytest.mark.root
@pytest.mark.parametrize("access_type", ["mount", "block"])
def test_hostpath_passes(tmp_path: Path, access_type: str) -> None:
    """The hostpath driver with attach on passes the suite on real mounts and loop devices
    (10 GiB sparse volumes, the suite's default), and leaves nothing mounted or attached."""
    config = HostPathConfig(
        state_dir=str(tmp_path / "state"), node_id="node-1", enable_attach=True, attach_limit=3
    )
    with HostPathDriver(config).serve() as running:
        result = run_suite(
            running.endpoint,
            tmp_path / "suite",
            "--csi-access-type", access_type,
            "--csi-test-node-volume-attach-limit",
        )  # fmt: skip
    assert_clean(result, HOSTPATH_SKIPS)
    assert no_mounts_under(tmp_path) and not loops_under(tmp_path)


@pytest.mark.root
def test_hostpath_shared_filesystem_passes(tmp_path: Path) -> None:
    """In shared-filesystem mode the hostpath driver passes the suite too."""
    config = HostPathConfig(
        state_dir=str(tmp_path / "state"),
        node_id="node-1",
        shared_filesystem=str(tmp_path / "shared.img"),
        shared_filesystem_size=64 << 20,
        enable_attach=True,
        attach_limit=3,
    )
    with HostPathDriver(config).serve() as running:
        result = run_suite(
            running.endpoint, tmp_path / "suite", "--csi-test-node-volume-attach-limit"
        )
    assert_clean(result, HOSTPATH_SKIPS)
    assert no_mounts_under(tmp_path) and not loops_under(tmp_path)


@pytest.mark.slow
def test_suite_needs_an_endpoint(tmp_path: Path) -> None:
    """Collected without --csi-endpoint, the suite stops with a usage error."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
         "kubevol.csidriver.sanity"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 4 and "--csi-endpoint" in proc.stderr


@pytest.mark.slow
def test_plugin_adds_nothing_to_other_runs(tmp_path: Path) -> None:
    """In an unrelated pytest run the plugin only adds its options: one test, one pass."""
    (tmp_path / "test_other.py").write_text("def test_one():\n    assert True\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_other.py",
         "--csi-volume-size", "1Gi"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
