"""Fixtures for the registration tests: a real CSI driver on a unix socket, a registry, and
a kubelet-style ``plugins_registry`` directory."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from kubevol.csidriver.server import ServerHandle
from kubevol.plugins.csi.registration import DriverRegistry
from kubevol.testing.csi_driver import FakeCSIDriver
from tests.plugins.csi.plugin.csiplugin_driver import dir_driver, serve_dir_driver


@attrs.define
class Node:
    """A served driver, a registry and the registration directory."""

    driver: FakeCSIDriver
    handle: ServerHandle
    registry: DriverRegistry
    registry_dir: Path
    events: list[tuple[str, str]]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """The test driver served at tmp/csi.sock, a fresh registry recording its events."""
    (tmp_path / "state").mkdir()
    driver = dir_driver(tmp_path / "state", max_volumes=3)
    handle = serve_dir_driver(driver, tmp_path / "csi.sock")
    registry = DriverRegistry(node_info_timeout=10, client_timeout=10)
    events: list[tuple[str, str]] = []
    registry.add_listener(lambda event, d: events.append((event, d.name)))
    # Unix socket paths are limited to 107 bytes and tmp_path is long: reach the kubelet root
    # (under tmp_path) through a short symlink in /tmp.
    (tmp_path / "kubelet").mkdir()
    short = Path(tempfile.mkdtemp(prefix="kv-")) / "k"
    short.symlink_to(tmp_path / "kubelet")
    registry_dir = short / "plugins_registry"
    try:
        yield Node(driver, handle, registry, registry_dir, events)
    finally:
        registry.close()
        handle.stop(grace=1)
        short.unlink()
        short.parent.rmdir()
