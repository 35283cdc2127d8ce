"""Fixtures for the CSI plugin manager tests: real plugin processes (the test driver,
``python -m kubevol.testing.csi_driver``, mounting for real) on unix sockets, and a finalizer
that unmounts whatever the tests or the plugins mounted under the test's tmp_path.

Run as root in a private mount namespace (``unshare -m --propagation private``): the
plugins inherit it, so their bind mounts are visible to the test and vanish with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.nomad import PluginRegistry, PluginType, RegisteredPlugin
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until


def accepts(path: str) -> bool:
    """Whether something accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


class PluginProcess:
    """One test driver process; restartable on the same socket, log and state."""

    def __init__(self, name: str, socket_path: str, log_path: Path, args: tuple[str, ...]) -> None:
        self.name = name
        self.socket_path = socket_path
        self.log_path = log_path
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> PluginProcess:
        """Start the driver and wait until its socket accepts calls."""
        assert self.proc is None or self.proc.poll() is not None
        cmd = [sys.executable, "-m", "kubevol.testing.csi_driver", "--endpoint",
               self.socket_path, "--name", self.name, "--log", str(self.log_path),
               "--state-dir", str(self.log_path.with_suffix(".state"))]
        args = (*self.args, *extra)
        if "--mode" not in args:
            cmd += ["--mode", "node"]
        cmd += args
        self.proc = subprocess.Popen(cmd)
        # Wait for a connection, not the file: a killed driver leaves its socket behind.
        wait_until(lambda: accepts(self.socket_path), 20, f"socket {self.socket_path}")
        return self

    def kill(self) -> None:
        """SIGKILL the driver (its socket file stays behind, as after a crash)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM and wait (the driver removes its socket). Idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def calls(self, rpc: str | None = None) -> list[dict[str, Any]]:
        """Logged calls, oldest first, optionally of one RPC."""
        if not self.log_path.exists():
            return []
        entries = [json.loads(line) for line in self.log_path.read_text().splitlines() if line]
        return [e for e in entries if rpc is None or e["rpc"] == rpc]

    def registration(
        self,
        root: Path,
        *,
        alloc_id: str = "plugin-alloc-1",
        plugin_type: PluginType = PluginType.CSI_NODE,
    ) -> RegisteredPlugin:
        """The registry entry an agent would make for this process."""
        return RegisteredPlugin(
            type=plugin_type,
            name=self.name,
            alloc_id=alloc_id,
            socket_path=self.socket_path,
            mount_root=str(root),
        )


PluginFactory = Callable[..., PluginProcess]


@pytest.fixture
def sock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short directory for unix sockets (their paths are limited to 107 bytes)."""
    return tmp_path_factory.mktemp("s")


@pytest.fixture
def plugins(sock_dir: Path, tmp_path: Path) -> Iterator[PluginFactory]:
    """Start plugin processes: ``plugins("name", "--no-stage", start=True)``; all are
    stopped afterwards."""
    made: list[PluginProcess] = []

    def make(name: str, *args: str, start: bool = True) -> PluginProcess:
        proc = PluginProcess(name, str(sock_dir / f"{name}.sock"), tmp_path / f"{name}.jsonl", args)
        made.append(proc)
        return proc.start() if start else proc

    yield make
    for proc in made:
        proc.stop()


@pytest.fixture
def volume_source(tmp_path: Path) -> Path:
    """A directory standing for the storage behind a test driver's volume (its volume
    context's ``source``), with one file ``hello``."""
    src = tmp_path / "volume-source"
    src.mkdir()
    (src / "hello").write_text("hello from the volume")
    return src


HOSTPATH_SCRIPT = Path(__file__).with_name("hostpath_process.py")

#: Starts kubevol's bundled hostpath driver as a process: ``hostpath_driver("--enable-attach")``
#: returns its socket path.
HostPathFactory = Callable[..., str]


@pytest.fixture
def hostpath_driver(tmp_path: Path, sock_dir: Path) -> Iterator[HostPathFactory]:
    """Start the bundled hostpath driver (node id ``node-1``) in its own process; each call
    returns the socket of a new one. All are stopped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> str:
        socket_path = str(sock_dir / f"hostpath-{len(procs)}.sock")
        state = tmp_path / f"hostpath-state-{len(procs)}"
        proc = subprocess.Popen(
            [sys.executable, str(HOSTPATH_SCRIPT), str(state), socket_path, *flags]
        )
        procs.append(proc)
        wait_until(lambda: accepts(socket_path) or proc.poll() is not None, 20, socket_path)
        assert proc.poll() is None, "the hostpath driver exited"
        return socket_path

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def unmount_leftovers(tmp_path: Path) -> Iterator[None]:
    """Unmount, last first, everything still mounted under tmp_path after the test (the
    test fails if it cannot)."""
    if os.geteuid() != 0:
        pytest.fail("the CSI manager tests need root: run them in `unshare -m` as root")
    yield
    # The table is read again after each unmount: with shared propagation one unmount
    # can take others along.
    problems: list[str] = []
    while (left := mounts_under(tmp_path)) and len(problems) < len(left):
        path = left[-1]
        result = subprocess.run(["umount", path], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            lazy = subprocess.run(["umount", "-l", path], capture_output=True, check=False)
            if lazy.returncode != 0:
                problems.append(f"umount {path}: {result.stderr.strip()}")
                break
    assert not problems, problems


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[PluginRegistry]:
    """A registry persisted under tmp_path, closed afterwards."""
    reg = PluginRegistry(str(tmp_path / "state" / "registry.json"))
    yield reg
    reg.close()
