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

from kubevol.csi.client import CSIClient
from kubevol.csi.server import StoragePlugin, serve_in_background
from kubevol.testing.csi_driver import FakeCSIDriver
from tests.csi.support import ProcessFactory, Served, ServeFactory, wait_for_socket


@pytest.fixture
def serve_driver(tmp_path: Path) -> Iterator[ServeFactory]:
    """Serve the test driver (or a given plugin) with an env; stops everything afterwards."""
    started: list[Served] = []

    def start(
        env: Mapping[str, str] | None = None,
        *,
        plugin: StoragePlugin | None = None,
        driver: FakeCSIDriver | None = None,
        socket_name: str = "csi.sock",
        **kwargs: Any,
    ) -> Served:
        driver = driver or FakeCSIDriver()
        if plugin is None:
            plugin = driver.plugin()
        endpoint = f"unix://{tmp_path / socket_name}"
        handle = serve_in_background(plugin, endpoint, env=dict(env or {}), **kwargs)
        served = Served(handle, driver, CSIClient(handle.address, timeout=20))
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
    """Start the test driver as a separate process (``python -m kubevol.testing.csi_driver``
    with ``args``, its server configured by ``env``); killed by PID afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        socket_path: Path, env: Mapping[str, str], *args: str
    ) -> subprocess.Popen[bytes]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("X_CSI", "CSI_"))}
        full_env.update(env)
        full_env["CSI_ENDPOINT"] = f"unix://{socket_path}"
        command = [sys.executable, "-m", "kubevol.testing.csi_driver", *args]
        with open(tmp_path / f"{socket_path.name}.log", "ab") as log:
            proc = subprocess.Popen(command, env=full_env, stdout=log, stderr=log)
        procs.append(proc)
        wait_for_socket(socket_path, proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
