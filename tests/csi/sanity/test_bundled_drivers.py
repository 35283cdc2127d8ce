"""The bundled drivers pass the conformance suite in mount and block mode (real mounts and
loop devices for hostpath), and the suite fails drivers that break the spec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubevol.csi.drivers.common import RunningDriver, serve_plugin
from kubevol.csi.drivers.engine import Engine, EngineController, MemoryStore, build_storage_plugin
from kubevol.csi.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.csi.drivers.mock import MockBackend, MockConfig, MockDriver
from kubevol.csi.errors import CSIRPCError
from kubevol.mount.mountinfo import parse_mountinfo
from tests.csi.sanity.suite import SuiteResult, run_suite

#: What the bundled drivers do not advertise by default: GetSnapshot (opt-in, unknown to
#: upstream csi-sanity).
DEFAULT_SKIPS = frozenset({"test_get_snapshot"})
#: ... and the hostpath driver has no ControllerModifyVolume.
HOSTPATH_SKIPS = DEFAULT_SKIPS | {
    "test_controller_modify_volume",
    "test_create_volume_with_volume_attributes_class",
}


def assert_clean(result: SuiteResult, allowed_skips: frozenset[str] = frozenset()) -> None:
    """No failure, no skip beyond ``allowed_skips``, and a plausible number of passes."""
    assert result.exit_code == 0 and not result.failed, result.describe()
    assert result.skipped <= allowed_skips, result.describe()
    assert len(result.passed) >= 40, result.describe()


def no_mounts_under(base: Path) -> bool:
    """Whether nothing is mounted below ``base``."""
    prefix = str(base) + "/"
    return not any(e.mount_point.startswith(prefix) for e in parse_mountinfo())


def loops_under(base: Path) -> str:
    """losetup's lines for images below ``base``."""
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return "".join(line for line in out.splitlines(keepends=True) if str(base) in line)


@pytest.mark.parametrize("access_type", ["mount", "block"])
def test_mock_passes(tmp_path: Path, access_type: str) -> None:
    """The mock (creating target paths) passes every test of the suite, nothing skipped."""
    params = tmp_path / "mutable.yaml"
    params.write_text("iops: '100'\n")
    with MockDriver(MockConfig(node_id="node-1", mock_mount=True)).serve() as running:
        result = run_suite(
            running.endpoint,
            tmp_path / "suite",
            "--csi-access-type", access_type,
            "--csi-mutable-params-file", str(params),
        )  # fmt: skip
    assert_clean(result, DEFAULT_SKIPS)


@pytest.mark.parametrize("access_type", ["mount", "block"])
def test_hostpath_passes(tmp_path: Path, access_type: str) -> None:
    """The hostpath driver with attach on passes the suite on real mounts, and leaves
    nothing mounted or attached."""
    config = HostPathConfig(state_dir=str(tmp_path / "state"), node_id="node-1", enable_attach=True)
    with HostPathDriver(config).serve() as running:
        result = run_suite(running.endpoint, tmp_path / "suite", "--csi-access-type", access_type)
    assert_clean(result, HOSTPATH_SKIPS)
    assert no_mounts_under(tmp_path) and not loops_under(tmp_path)


def test_hostpath_shared_filesystem_passes(tmp_path: Path) -> None:
    """In shared-filesystem mode the hostpath driver passes the suite too."""
    config = HostPathConfig(
        state_dir=str(tmp_path / "state"),
        node_id="node-1",
        shared_filesystem=str(tmp_path / "shared.img"),
        shared_filesystem_size=64 << 20,
        enable_attach=True,
    )
    with HostPathDriver(config).serve() as running:
        result = run_suite(running.endpoint, tmp_path / "suite", "--csi-idempotent-count", "2")
    assert_clean(result, HOSTPATH_SKIPS)
    assert no_mounts_under(tmp_path) and not loops_under(tmp_path)


def test_suite_catches_a_driver_that_leaves_targets_missing(tmp_path: Path) -> None:
    """A driver that never creates the target path fails the lifecycle tests."""
    with MockDriver(MockConfig(node_id="node-1", mock_mount=False)).serve() as running:
        result = run_suite(running.endpoint, tmp_path / "suite")
    assert result.exit_code == 1
    assert result.failed == {"test_full_lifecycle", "test_full_lifecycle_is_idempotent"}
    assert "must create the target path" in result.output


class WrongTokenController(EngineController):
    """Answers INVALID_ARGUMENT for a bad ListVolumes token, as many drivers wrongly do."""

    def list_volumes(self, request: Any, context: Any) -> Any:
        if request.starting_token == "invalid-token":
            raise CSIRPCError(grpc.StatusCode.INVALID_ARGUMENT, "bad token")
        return super().list_volumes(request, context)


def test_suite_catches_invalid_argument_for_a_bad_token(tmp_path: Path) -> None:
    """The suite demands ABORTED for an unknown ListVolumes token."""
    config = MockConfig(node_id="node-1", mock_mount=True)
    engine = Engine(config.settings(), MockBackend(True), MemoryStore())
    plugin = build_storage_plugin(engine)
    broken = type(plugin)(
        identity=plugin.identity,
        controller=WrongTokenController(engine),
        node=plugin.node,
        group_controller=plugin.group_controller,
    )
    running: RunningDriver
    with serve_plugin(broken) as running:
        result = run_suite(running.endpoint, tmp_path / "suite", "-k", "token")
    assert result.failed == {"test_list_volumes_invalid_token_is_aborted"}, result.describe()
    assert "expected ABORTED, got INVALID_ARGUMENT" in result.output


def test_suite_needs_an_endpoint(tmp_path: Path) -> None:
    """Collected without --csi-endpoint, the suite stops with a usage error."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
         "kubevol.csi.sanity"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 4 and "--csi-endpoint" in proc.stderr


def test_plugin_adds_nothing_to_other_runs(tmp_path: Path) -> None:
    """In an unrelated pytest run the plugin only adds its options: one test, one pass."""
    (tmp_path / "test_other.py").write_text("def test_one():\n    assert True\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_other.py",
         "--csi-volume-size", "1Gi"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
