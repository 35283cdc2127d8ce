"""Fixtures: bundled drivers served on real unix sockets, with checks that nothing they
mounted or attached outlives a test."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver
from kubevol.testing.mount_rig import mounts_under


def loops_under(base: Path) -> list[tuple[str, str]]:
    """Loop devices whose backing file lies below ``base``: ``(device, file)``."""
    out = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(str(base)):
            found.append((parts[0], parts[1].strip()))
    return found


def force_clean(base: Path) -> list[str]:
    """Unmount and detach whatever is left below ``base``; returns what was left."""
    left = mounts_under(base)
    for mount_point in reversed(left):
        subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)
    loops = loops_under(base)
    for dev, _ in loops:
        subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)
    return left + [f"{dev} ({img})" for dev, img in loops]


@attrs.define
class Served:
    """A driver being served, a client for it, and the config it runs with."""

    running: RunningDriver
    client: CSIClient
    config: Any

    def stop(self) -> None:
        """Stop serving (mounts and state stay, as after a driver crash or upgrade)."""
        self.client.close()
        self.running.stop(grace=2)


HostPathFactory = Callable[..., Served]


@pytest.fixture
def hostpath_factory(tmp_path: Path) -> Iterator[HostPathFactory]:
    """Start hostpath drivers on ``tmp_path/state`` (config overrides as keywords); at the
    end, stop them and fail if anything below ``tmp_path`` is still mounted or attached."""
    started: list[Served] = []

    def start(**overrides: Any) -> Served:
        values: dict[str, Any] = {"state_dir": str(tmp_path / "state"), "node_id": "node-1"}
        values.update(overrides)
        config = HostPathConfig(**values)
        running = HostPathDriver(config).serve()
        served = Served(running, CSIClient(running.endpoint, timeout=30), config)
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        served.stop()
    left = force_clean(tmp_path)
    assert not left, f"left mounted or attached after the test: {left}"


@pytest.fixture
def hostpath(hostpath_factory: HostPathFactory) -> Served:
    """A hostpath driver with the default configuration."""
    return hostpath_factory()


@pytest.fixture
def mock_factory(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start mock drivers (config overrides as keywords); stopped at the end."""
    started: list[Served] = []

    def start(**overrides: Any) -> Served:
        config = MockConfig(**{"node_id": "node-1", **overrides})
        running = MockDriver(config).serve()
        served = Served(running, CSIClient(running.endpoint, timeout=30), config)
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        served.stop()


@pytest.fixture
def staging_dir(tmp_path: Path) -> Callable[[str], str]:
    """Make a staging directory (the CO's job) and return its path."""

    def make(name: str = "staging") -> str:
        path = tmp_path / "plugins" / name
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    return make


def target_path(tmp_path: Path, name: str = "target") -> str:
    """A target path whose parent exists (the CO's job); the driver creates the target."""
    parent = tmp_path / "pods" / name
    parent.mkdir(parents=True, exist_ok=True)
    return os.path.join(parent, "mount")
