"""Covers kubevol.cli.driver: ``kubevol driver``.

``kubevol driver``: version YAML, and serving the bundled drivers as real processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.mount.mountinfo import parse_mountinfo

KUBEVOL = [sys.executable, "-m", "kubevol.cli.main"]


class DriverProcess:
    """``kubevol driver serve ...`` in a child process, stopped by PID."""

    def __init__(self, args: list[str], socket: Path) -> None:
        self.socket = socket
        self.proc = subprocess.Popen(
            [*KUBEVOL, "driver", "serve", *args, "--endpoint", f"unix://{socket}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 20
        while not socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"driver did not start: {self.proc.communicate()[1]}")
            time.sleep(0.05)

    def client(self) -> CSIClient:
        """A client of the driver."""
        return CSIClient(f"unix://{self.socket}", timeout=20)

    def stop(self) -> tuple[int, str]:
        """SIGTERM, wait; (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err


@pytest.fixture
def processes() -> Iterator[list[DriverProcess]]:
    """Driver processes started by a test; all stopped at the end."""
    started: list[DriverProcess] = []
    yield started
    for proc in started:
        proc.stop()


def test_version_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    """version prints driver name and version, commit, build date, Python and platform."""
    assert main(["driver", "version", "--driver", "mock"]) == 0
    info = yaml.safe_load(capsys.readouterr().out)
    assert info["driverName"] == "mock.csi.kubevol.io"
    assert set(info) == {
        "driverName", "driverVersion", "gitCommit", "buildDate",
        "pythonVersion", "compiler", "platform",
    }  # fmt: skip
    assert info["pythonVersion"] == ".".join(map(str, sys.version_info[:3]))
    assert main(["driver", "version", "--driver", "x.example.com", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["driverName"] == "x.example.com"


def test_serve_mock_with_flags_and_stop_on_sigterm(
    processes: list[DriverProcess], tmp_path: Path
) -> None:
    """--node-id, --driver-name and capability flags apply; SIGTERM exits 0 and removes
    the socket; -v logs requests."""
    sock = tmp_path / "mock.sock"
    proc = DriverProcess(
        ["mock", "--node-id", "n7", "--driver-name", "x.example.com", "--node-caps", "none", "-v"],
        sock,
    )
    processes.append(proc)
    with proc.client() as client:
        assert client.get_plugin_info().name == "x.example.com"
        assert client.node_get_info().node_id == "n7"
        assert client.node_get_capabilities() == frozenset()
    code, err = proc.stop()
    assert code == 0 and not sock.exists()
    assert "NodeGetInfo: REQ" in err


@pytest.mark.root
def test_serve_hostpath_keeps_volumes_across_restarts(
    processes: list[DriverProcess], tmp_path: Path
) -> None:
    """A hostpath driver process restarted on the same --state-dir serves the volume it
    had, still staged, and tears it down."""
    state, sock = tmp_path / "state", tmp_path / "hp.sock"
    args = ["hostpath", "--state-dir", str(state), "--node-id", "n1", "--capacity", "1Gi"]
    first = DriverProcess(args, sock)
    processes.append(first)
    staging = tmp_path / "staging"
    staging.mkdir()
    cap = t.VolumeCapability.mount()
    with first.client() as client:
        vol = client.create_volume("kept", [cap])
        client.node_stage_volume(vol.volume_id, str(staging), cap)
    assert first.stop()[0] == 0
    second = DriverProcess(args, sock)
    processes.append(second)
    with second.client() as client:
        assert [e.volume.volume_id for e in client.list_volumes().entries] == [vol.volume_id]
        assert client.get_capacity().available_capacity == (1 << 30) - vol.capacity_bytes
        client.node_unstage_volume(vol.volume_id, str(staging))
        client.delete_volume(vol.volume_id)
    assert not any(e.mount_point == str(staging) for e in parse_mountinfo())


def test_serve_needs_an_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --endpoint or CSI_ENDPOINT, serve exits 64 (usage) with a message."""
    env = dict(os.environ)
    env.pop("CSI_ENDPOINT", None)
    result = subprocess.run(
        [*KUBEVOL, "driver", "serve", "mock"], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == exits.USAGE and "CSI_ENDPOINT" in result.stderr
