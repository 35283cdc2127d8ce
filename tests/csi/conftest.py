"""Fixtures: the test driver served on a real unix socket in a temp dir, and clients for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from driver import Behaviour, make_plugin

from kubevol.csi.client import CSIClient
from kubevol.csi.server import ServerHandle, StoragePlugin, serve_in_background

DRIVER_SCRIPT = Path(__file__).with_name("driver_process.py")


class Served:
    """A served test driver: its handle, behaviour knobs and a client."""

    def __init__(self, handle: ServerHandle, behaviour: Behaviour, client: CSIClient) -> None:
        self.handle = handle
        self.behaviour = behaviour
        self.client = client


ServeFactory = Callable[..., Served]


@pytest.fixture
def serve_driver(tmp_path: Path) -> Iterator[ServeFactory]:
    """Serve the test driver (or a given plugin) with an env; stops everything afterwards."""
    started: list[Served] = []

    def start(
        env: Mapping[str, str] | None = None,
        *,
        plugin: StoragePlugin | None = None,
        behaviour: Behaviour | None = None,
        socket_name: str = "csi.sock",
        **kwargs: Any,
    ) -> Served:
        if plugin is None:
            plugin, behaviour = make_plugin(behaviour)
        endpoint = f"unix://{tmp_path / socket_name}"
        handle = serve_in_background(plugin, endpoint, env=dict(env or {}), **kwargs)
        served = Served(handle, behaviour or Behaviour(), CSIClient(handle.address, timeout=20))
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        served.client.close()
        served.handle.stop(grace=1)


@pytest.fixture
def served(serve_driver: ServeFactory) -> Served:
    """The test driver with no middleware switched on."""
    return serve_driver()


ProcessFactory = Callable[..., "subprocess.Popen[bytes]"]


def wait_for_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """Wait until ``path`` is a socket, failing early if ``proc`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_socket():
            return
        if proc.poll() is not None:
            raise AssertionError(f"driver process exited with {proc.returncode}")
        time.sleep(0.05)
    raise AssertionError(f"driver socket {path} did not appear")


@pytest.fixture
def driver_process(tmp_path: Path) -> Iterator[ProcessFactory]:
    """Start the test driver as a separate process; killed by PID afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(socket_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("X_CSI", "CSI_"))}
        full_env.update(env)
        full_env["CSI_ENDPOINT"] = f"unix://{socket_path}"
        log = open(tmp_path / f"{socket_path.name}.log", "ab")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER_SCRIPT)], env=full_env, stdout=log, stderr=log
        )
        log.close()
        procs.append(proc)
        wait_for_socket(socket_path, proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
