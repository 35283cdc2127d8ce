"""Helpers shared by the CSI tests (types of the fixtures, waiting for sockets and files).

Importable as ``tests.csi.support``: ``tests/csi/conftest.py`` puts the repository root on
``sys.path``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from kubevol.csi.client import CSIClient
from kubevol.csi.server import ServerHandle
from tests.csi.driver import Behaviour

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER_SCRIPT = Path(__file__).with_name("driver_process.py")


class Served:
    """A served test driver: its handle, behaviour knobs and a client."""

    def __init__(self, handle: ServerHandle, behaviour: Behaviour, client: CSIClient) -> None:
        self.handle = handle
        self.behaviour = behaviour
        self.client = client


ServeFactory = Callable[..., Served]
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


def wait_for_file(path: Path, timeout: float = 20) -> None:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.02)
