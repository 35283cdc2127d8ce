"""One logging scheme for served drivers (kubevol.csidriver.server.logs): a driver started
with ``serve()`` says where it listens and logs every failed call, on stderr when its
process configured no logging and through the host's handlers when it did (which ``serve``
leaves alone); X_CSI_LOG_LEVEL, X_CSI_DEBUG and X_CSI_REQ_LOGGING work; an explicit
``kubevol -v N driver serve`` is not overridden by X_CSI_LOG_LEVEL."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kubevol.csi._pb import csi_pb2
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.server import ServerConfig
from kubevol.csidriver.server.logs import driver_logging
from tests.csi.support import wait_for_socket

ROOT = Path(__file__).resolve().parents[2]

#: A driver process: the test double served with serve(); "host" configures logging first
#: (one handler, WARNING, its own format), as an application embedding a driver would.
DRIVER = textwrap.dedent("""\
    import logging, sys
    import attrs
    from kubevol.csidriver.server import serve
    from tests.csi.support import make_plugin
    if sys.argv[1] == "host":
        logging.basicConfig(format="HOST %(levelname)s %(name)s: %(message)s",
                            level=logging.WARNING)
    plugin, _ = make_plugin()
    sys.exit(serve(attrs.evolve(plugin, name="fake.example.com")))
""")


def _run(argv: list[str], sock: Path, env: dict[str, str], call: str = "ListSnapshots") -> str:
    """Start ``argv`` serving on ``sock``, make one failing call and one good one, stop it
    with SIGTERM; its stderr."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("X_CSI_", "CSI_"))}
    proc = subprocess.Popen(
        argv, cwd=ROOT, env={**clean, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for_socket(sock, proc)
        with CSIClient(f"unix://{sock}", timeout=10) as client:
            assert client.probe()
            request = (
                csi_pb2.ListSnapshotsRequest() if call == "ListSnapshots"
                else csi_pb2.NodeStageVolumeRequest()
            )  # fmt: skip
            with pytest.raises(CSIRPCError):
                client.call(call, request)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    return err.decode()


def _driver(mode: str, sock: Path, env: dict[str, str] | None = None) -> str:
    env = {"CSI_ENDPOINT": f"unix://{sock}", **(env or {})}
    return _run([sys.executable, "-c", DRIVER, mode], sock, env)


@pytest.mark.slow
def test_a_driver_without_logging_set_up_logs_its_start_and_failed_calls(tmp_path: Path) -> None:
    """serve() in a process that configured no logging: timestamped lines on stderr say
    where the driver listens (INFO, gocsi's effective default) and which call failed with
    which code and message (ERROR, as klog logs a Go driver's failed calls)."""
    sock = tmp_path / "csi.sock"
    err = _driver("bare", sock)
    assert (
        f"INFO kubevol.csidriver.server: serving fake.example.com (controller and node) "
        f"on unix://{sock}" in err
    )
    assert "ERROR kubevol.csidriver.server: ListSnapshots failed: UNIMPLEMENTED" in err


@pytest.mark.slow
def test_log_level_and_request_logging_variables_apply(tmp_path: Path) -> None:
    """X_CSI_LOG_LEVEL=ERROR hides the start line and keeps failed calls; X_CSI_DEBUG and
    X_CSI_REQ_LOGGING log requests."""
    err = _driver("bare", tmp_path / "a.sock", {"X_CSI_LOG_LEVEL": "ERROR"})
    assert "serving" not in err and "ListSnapshots failed: UNIMPLEMENTED" in err
    err = _driver("bare", tmp_path / "b.sock", {"X_CSI_DEBUG": "true"})
    assert "Probe: REQ" in err and "Probe: REP" in err and "serving fake.example.com" in err
    err = _driver("bare", tmp_path / "c.sock",
                  {"X_CSI_LOG_LEVEL": "ERROR", "X_CSI_REQ_LOGGING": "true"})  # fmt: skip
    assert "Probe: REQ" in err and "Probe: REP" not in err


@pytest.mark.slow
def test_a_host_that_configured_logging_keeps_its_handlers_and_level(tmp_path: Path) -> None:
    """An application that set up logging (its format, WARNING) gets each line once, in its
    format, at its level: no second handler, no start line at INFO. X_CSI_LOG_LEVEL, when
    set, still sets the level of kubevol's loggers; request logging shows whatever the
    level."""
    err = _driver("host", tmp_path / "a.sock")
    assert "HOST ERROR kubevol.csidriver.server: ListSnapshots failed: UNIMPLEMENTED" in err
    assert err.count("ListSnapshots failed") == 1
    assert "serving" not in err
    err = _driver("host", tmp_path / "b.sock", {"X_CSI_LOG_LEVEL": "INFO"})
    assert "HOST INFO kubevol.csidriver.server: serving fake.example.com" in err
    err = _driver("host", tmp_path / "c.sock", {"X_CSI_REQ_LOGGING": "1"})
    assert "HOST INFO kubevol.csidriver.server: Probe: REQ" in err


def test_driver_logging_restores_what_it_changed() -> None:
    """What serve() changes in a host's logging (a level, a handler) is undone when it
    returns."""
    root, kubevol = logging.getLogger(), logging.getLogger("kubevol")
    before = (root.level, list(root.handlers), kubevol.level)
    with driver_logging(ServerConfig.from_env({"X_CSI_DEBUG": "1"})):
        assert logging.getLogger("kubevol.csidriver.server").isEnabledFor(logging.DEBUG)
    assert (root.level, list(root.handlers), kubevol.level) == before


def _cli(sock: Path, env: dict[str, str], *global_flags: str) -> str:
    argv = [sys.executable, "-m", "kubevol.cli.main", *global_flags, "driver", "serve", "mock",
            "--endpoint", f"unix://{sock}"]  # fmt: skip
    return _run(argv, sock, env, call="NodeStageVolume")


@pytest.mark.slow
def test_kubevol_driver_serve_logs_start_and_failed_calls(tmp_path: Path) -> None:
    """``kubevol driver serve`` (verbosity 2 by default) logs its start and failed calls
    through the CLI's one handler; X_CSI_LOG_LEVEL=ERROR, when set, quiets the start."""
    err = _cli(tmp_path / "a.sock", {})
    assert f"on unix://{tmp_path / 'a.sock'}" in err and " serving " in err
    assert "NodeStageVolume failed: INVALID_ARGUMENT" in err
    err = _cli(tmp_path / "b.sock", {"X_CSI_LOG_LEVEL": "ERROR"})
    assert " serving " not in err and "NodeStageVolume failed" in err


@pytest.mark.slow
def test_explicit_verbosity_wins_over_x_csi_log_level(tmp_path: Path) -> None:
    """``kubevol -v 5 driver serve`` logs its start even with X_CSI_LOG_LEVEL=ERROR in the
    environment, and ``-v 0`` stays quiet with X_CSI_LOG_LEVEL=DEBUG: the operator's flag
    is not reset by the variable."""
    err = _cli(tmp_path / "a.sock", {"X_CSI_LOG_LEVEL": "ERROR"}, "-v", "5")
    assert " serving " in err and "NodeStageVolume failed" in err
    err = _cli(tmp_path / "b.sock", {"X_CSI_LOG_LEVEL": "DEBUG"}, "-v", "0")
    assert " serving " not in err and "NodeStageVolume failed" in err
