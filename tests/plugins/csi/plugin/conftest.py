"""Fixtures for the CSI plugin tests: a kubelet root, a real CSI driver on a unix socket,
a registry with the driver registered, and the plugin initialised on a NodeVolumeHost.

Everything is real: bind mounts, loop devices, gRPC. The rig's finalizer unmounts anything
still mounted under the test's directory, stops the driver and closes the clients.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME as HOSTPATH_DRIVER
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.node.host import NodeVolumeHost
from kubevol.plugins.csi import CSIPlugin
from kubevol.plugins.csi.registration import DriverRegistry
from kubevol.testing.mount_rig import unmount_all_under
from tests.plugins.csi.plugin.csiplugin_driver import (
    detach_loops_under,
)
from tests.plugins.csi.plugin.rig import (
    HOSTPATH_NODE_ID,
    NODE_NAME,
    HostPathRig,
    HostPathRigFactory,
    LoopDevices,
    Rig,
    RigFactory,
    RigMaker,
)


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[RigFactory]:
    """Build a Rig: ``make_rig(node_caps=..., controller_caps=..., register=True, **plugin)``."""
    if os.geteuid() != 0:
        pytest.fail("the CSI plugin tests need root (real mounts)")
    maker = RigMaker(tmp_path)
    yield maker.make
    maker.close()


@pytest.fixture
def rig(make_rig: RigFactory) -> Rig:
    """A Rig whose driver stages (STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS)."""
    return make_rig()


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[LoopDevices]:
    """Loop devices detached at the end of the test."""
    ld = LoopDevices(tmp_path)
    yield ld
    ld.cleanup()


@pytest.fixture
def hostpath_rig(tmp_path: Path) -> Iterator[HostPathRigFactory]:
    """``hostpath_rig(guard_policy=..., shared=False, **HostPathConfig overrides)``: a hostpath
    driver (``shared``: on one shared filesystem image) on
    a unix socket, its state under tmp_path, registered in the plugin's registry. At the
    end everything is stopped, and the test fails if anything is left mounted or attached."""
    if os.geteuid() != 0:
        pytest.fail("the CSI plugin tests need root (real mounts)")
    made: list[HostPathRig] = []

    def make(*, guard_policy: str = "safe", shared: bool = False, **config: Any) -> HostPathRig:
        base = tmp_path / f"hp{len(made)}"
        root = base / "kubelet"
        root.mkdir(parents=True)
        values: dict[str, Any] = {"state_dir": str(base / "state"), "node_id": HOSTPATH_NODE_ID}
        if shared:
            values["shared_filesystem"] = str(base / "shared.img")
            values["shared_filesystem_size"] = 64 << 20
        values.update(config)
        running = HostPathDriver(HostPathConfig(**values)).serve()
        registry = DriverRegistry(node_info_timeout=10, client_timeout=30)
        plugin = CSIPlugin(registry=registry, timeout=30, attach_timeout=10,
                           guard_policy=guard_policy)
        host = NodeVolumeHost(root_dir=str(root), node_name=NODE_NAME)
        plugin.init(host)
        rig = HostPathRig(base, root, running, CSIClient(running.endpoint, timeout=30), plugin,
                          host)
        made.append(rig)
        registry.register_driver(HOSTPATH_DRIVER, running.endpoint, ["1.0.0"])
        return rig

    yield make
    left: list[str] = []
    for rig in reversed(made):
        rig.plugin.registry.close()
        rig.client.close()
        rig.running.stop(grace=2)
        left += unmount_all_under(rig.base)
        left += detach_loops_under(rig.base)
    assert not left, f"left mounted or attached after the test: {left}"
