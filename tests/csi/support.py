"""Helpers shared by the CSI tests (types of the fixtures, waiting for sockets and files)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.server import ServerHandle, StoragePlugin
from kubevol.testing.csi_driver import FakeCSIDriver


class Served:
    """A served test driver: its handle, the driver (knobs and records) and a client."""

    def __init__(self, handle: ServerHandle, driver: FakeCSIDriver, client: CSIClient) -> None:
        self.handle = handle
        self.driver = driver
        self.client = client


def make_plugin(**kwargs: Any) -> tuple[StoragePlugin, FakeCSIDriver]:
    """A fresh test driver and its servable plugin (``kwargs`` go to
    :meth:`FakeCSIDriver.plugin`)."""
    driver = FakeCSIDriver()
    return driver.plugin(**kwargs), driver


ServeFactory = Callable[..., Served]
ProcessFactory = Callable[..., "subprocess.Popen[bytes]"]
#: The ``serve_hostpath`` fixture: serves the bundled hostpath driver in this process,
#: ``serve_hostpath(node_id="n1")``.
HostPathServer = Callable[..., RunningDriver]


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


def wait_for_file(path: Path, timeout: float = 20) -> None:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.02)
