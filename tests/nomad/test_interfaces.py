"""Covers kubevol.nomad.interface and kubevol.testing.fake_nomad.

The manager's interfaces (Nomad's ``Manager``, ``PluginManager``, ``VolumeMounter`` /
``VolumeManager``): the real classes and the shipped fake both implement them, so agent
code written against them runs on either; the config object and its injected logger; and
the seed's "Shutdown unmounts" behaviour as an explicit option."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.errors import PluginNotFoundError
from kubevol.nomad import (
    AccessMode,
    CSIManager,
    CSIVolume,
    ExpansionNotSupportedError,
    HealthState,
    Manager,
    ManagerConfig,
    ManagerShutdownError,
    MountInfo,
    NodeController,
    PluginManager,
    PluginRegistry,
    PluginType,
    RegisteredPlugin,
    UsageOptions,
    VolumeMounter,
    VolumeNotPublishedError,
)
from kubevol.testing import FakeCSIManager, FakeNodeController
from kubevol.testing.mount_rig import mounts_under
from tests.nomad.conftest import PluginFactory

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

USAGE = UsageOptions(access_mode=AccessMode.SINGLE_NODE_MULTI_WRITER)


def mount_for_alloc(manager: Manager, plugin_id: str, volume: CSIVolume, alloc: str) -> MountInfo:
    """Agent code written against the interface only."""
    manager.plugin_manager().run()
    assert manager.plugin_manager().wait_for_first_fingerprint(20)
    mounter = manager.mounter_for_plugin(plugin_id, timeout=20)
    info = mounter.mount_volume(volume, alloc, USAGE)
    assert mounter.has_mount(info)
    return info


class Records(logging.Handler):
    """Keeps the records of one logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def agent_logger() -> Iterator[tuple[logging.Logger, Records]]:
    """A logger of the agent's own, with its records kept."""
    logger = logging.getLogger("test-agent.csi")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    records = Records()
    logger.addHandler(records)
    yield logger, records
    logger.removeHandler(records)


def test_the_real_manager_implements_the_interfaces_and_serves_agent_code(
    plugins: PluginFactory,
    registry: PluginRegistry,
    tmp_path: Path,
    volume_source: Path,
    agent_logger: tuple[logging.Logger, Records],
) -> None:
    """A manager built from a config (Nomad's New(config)) is a Manager and its own
    PluginManager of type "csi"; its mounters are NodeControllers; agent code written
    against the interfaces mounts for real; and its records go to the injected logger."""
    logger, records = agent_logger
    proc = plugins("real")
    registry.register(proc.registration(tmp_path / "root"))
    config = ManagerConfig(registry=registry, logger=logger, fingerprint_interval=0.5)
    manager = CSIManager.from_config(config)
    assert manager.config == config
    assert isinstance(manager, Manager) and isinstance(manager, PluginManager)
    assert manager.plugin_manager() is manager and manager.plugin_type == "csi"
    try:
        volume = CSIVolume(id="v", context={"source": str(volume_source)})
        info = mount_for_alloc(manager, "real", volume, "a1")
        assert info.source in mounts_under(tmp_path / "root")
        mounter = manager.mounter_for_plugin("real")
        assert isinstance(mounter, NodeController) and isinstance(mounter, VolumeMounter)
        assert mounter.requires_staging and mounter.node_id
        mounter.unmount_volume("v", "", "a1", USAGE)
    finally:
        manager.shutdown()
    assert any("at shutdown: unhealthy" in m for m in records.messages), records.messages


def test_the_fake_implements_the_interfaces_and_serves_the_same_agent_code() -> None:
    """The shipped fake runs the same agent code, records each call, raises injected
    errors and refuses what the real one refuses."""
    manager = FakeCSIManager()
    controller = manager.add_plugin("fake")
    assert isinstance(manager, Manager) and isinstance(controller, NodeController)
    info = mount_for_alloc(manager, "fake", CSIVolume(id="v"), "a1")
    assert info.source == f"/fake/csi/per-alloc/a1/v/{USAGE.to_fs()}"
    assert [c.method for c in controller.calls] == ["mount_volume"]
    grow = t.CapacityRange(required_bytes=1 << 20)
    assert controller.expand_volume("v", "", "a1", USAGE, grow) == 1 << 20
    with pytest.raises(VolumeNotPublishedError):
        controller.expand_volume("v", "", "a2", USAGE, grow)
    controller.fail_next("unmount_volume", OSError("injected"))
    with pytest.raises(OSError, match="injected"):
        controller.unmount_volume("v", "", "a1", USAGE)
    assert controller.has_mount(info)
    with pytest.raises(PluginNotFoundError):
        manager.mounter_for_plugin("other")
    assert manager.wait_for_plugin("fake", 1).mount_root == "/fake/csi"
    with pytest.raises(TimeoutError):
        manager.wait_for_plugin("fake", 1, plugin_type=PluginType.CSI_CONTROLLER)
    manager.shutdown()
    assert controller.has_mount(info)  # kept by default
    with pytest.raises(ManagerShutdownError):
        manager.mounter_for_plugin("fake")
    with pytest.raises(ExpansionNotSupportedError):
        FakeNodeController(expandable=False).expand_volume("v", "", "a1", USAGE, grow)


def test_the_fake_can_unmount_on_shutdown_like_the_real_option() -> None:
    """FakeCSIManager(unmount_on_shutdown=True) unmounts what it mounted at shutdown."""
    manager = FakeCSIManager(["fake"], unmount_on_shutdown=True)
    controller = manager.controllers["fake"]
    info = mount_for_alloc(manager, "fake", CSIVolume(id="v"), "a1")
    manager.shutdown()
    assert not controller.has_mount(info)
    assert [c.method for c in controller.calls] == ["mount_volume", "unmount_volume"]


def test_wait_for_first_fingerprint_returns_for_healthy_and_unreachable_plugins(
    plugins: PluginFactory, registry: PluginRegistry, tmp_path: Path
) -> None:
    """The node fingerprinter's wait ends once every plugin was fingerprinted once, also
    one that never answers (reported undetected), so a dead plugin cannot hold it up."""
    registry.register(plugins("alive").registration(tmp_path / "alive"))
    registry.register(
        RegisteredPlugin(
            type=PluginType.CSI_NODE, name="dead", alloc_id="x",
            socket_path=str(tmp_path / "nothing.sock"), mount_root=str(tmp_path / "dead"),
        )
    )  # fmt: skip
    manager = CSIManager(registry, fingerprint_interval=30, rpc_timeout=2)
    manager.run()
    try:
        assert manager.wait_for_first_fingerprint(20)
        alive = manager.plugin_info(PluginType.CSI_NODE, "alive")
        dead = manager.plugin_info(PluginType.CSI_NODE, "dead")
        assert alive is not None and alive.health is HealthState.HEALTHY
        assert dead is not None and dead.health is HealthState.UNDETECTED
    finally:
        manager.shutdown()


def test_shutdown_keeps_volumes_by_default_and_unmounts_them_when_asked(
    plugins: PluginFactory, registry: PluginRegistry, tmp_path: Path, volume_source: Path
) -> None:
    """kubevol's default keeps every volume mounted across a manager shutdown; with
    unmount_on_shutdown (the seed's documented Shutdown) each allocation is unpublished
    and the volume unstaged once, through the plugin, and nothing stays mounted."""
    proc = plugins("real")
    root = tmp_path / "root"
    registry.register(proc.registration(root))
    volume = CSIVolume(id="v", context={"source": str(volume_source)})
    state = str(tmp_path / "state")

    keeping = CSIManager(registry, fingerprint_interval=0.5, state_dir=state)
    mount_for_alloc(keeping, "real", volume, "a1")
    mount_for_alloc(keeping, "real", volume, "a2")
    keeping.shutdown()
    assert len(mounts_under(root)) == 3  # one staging, two targets
    assert proc.calls("NodeUnpublishVolume") == []

    draining = CSIManager(
        registry, fingerprint_interval=0.5, state_dir=state, unmount_on_shutdown=True
    )
    draining.run()
    assert draining.config.unmount_on_shutdown
    draining.shutdown()
    assert mounts_under(root) == []
    assert len(proc.calls("NodeUnpublishVolume")) == 2
    assert len(proc.calls("NodeUnstageVolume")) == 1
