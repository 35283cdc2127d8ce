"""Fixtures: the test driver served on a real unix socket in a temp dir, and clients for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

# The CSI test helpers are imported as ``tests.csi.*`` (as mypy names them).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubevol.csi.client import CSIClient
from kubevol.csi.server import StoragePlugin, serve_in_background
from tests.csi.driver import Behaviour, make_plugin
from tests.csi.support import (
    DRIVER_SCRIPT,
    ProcessFactory,
    Served,
    ServeFactory,
    wait_for_socket,
)


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


@pytest.fixture
def driver_process(tmp_path: Path) -> Iterator[ProcessFactory]:
    """Start the test driver as a separate process; killed by PID afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(socket_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("X_CSI", "CSI_"))}
        full_env.update(env)
        full_env["CSI_ENDPOINT"] = f"unix://{socket_path}"
        with open(tmp_path / f"{socket_path.name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, str(DRIVER_SCRIPT)], env=full_env, stdout=log, stderr=log
            )
        procs.append(proc)
        wait_for_socket(socket_path, proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
