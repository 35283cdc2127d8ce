"""Fixtures for the attachment tests: the stand-in API server and CSI rigs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.testing.kube_api import KubeAPIServer
from tests.plugins.csi.plugin.rig import RigFactory, RigMaker


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    """A stand-in API server on loopback."""
    with KubeAPIServer() as server:
        yield server


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[RigFactory]:
    """CSI rigs (real driver, registry, plugin); see tests/plugins/csi/plugin/rig.py."""
    if os.geteuid() != 0:
        pytest.fail("the attachment tests need root (real mounts)")
    maker = RigMaker(tmp_path)
    yield maker.make
    maker.close()
