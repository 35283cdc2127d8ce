"""Covers kubevol.nomad.volumes: volume expansion.

NodeExpandVolume through the manager (Nomad's ``VolumeManager.ExpandVolume``): online
expansion of a claimed volume, against the bundled hostpath driver and the test driver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError, StatusCode
from kubevol.nomad import (
    AccessMode,
    CSIManager,
    CSIVolume,
    ExpansionNotSupportedError,
    NodeController,
    NodeEvent,
    PluginRegistry,
    PluginType,
    RegisteredPlugin,
    UsageOptions,
    VolumeNotPublishedError,
)
from tests.nomad.conftest import HostPathFactory, PluginFactory

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

MiB = 1 << 20
USAGE = UsageOptions(access_mode=AccessMode.SINGLE_NODE_WRITER)
CAP = t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_WRITER)


@pytest.fixture
def events() -> list[NodeEvent]:
    """Node events the manager sends."""
    return []


@pytest.fixture
def manager(
    registry: PluginRegistry, tmp_path: Path, events: list[NodeEvent]
) -> Iterator[CSIManager]:
    """A running manager on the test registry, shut down afterwards."""
    mgr = CSIManager(
        registry,
        fingerprint_interval=0.5,
        state_dir=str(tmp_path / "state"),
        trigger_node_event=events.append,
    )
    mgr.run()
    yield mgr
    mgr.shutdown()


def test_a_claimed_volume_is_expanded_online_after_the_controller_grew_it(
    hostpath_driver: HostPathFactory,
    registry: PluginRegistry,
    manager: CSIManager,
    tmp_path: Path,
    events: list[NodeEvent],
) -> None:
    """The node call is refused (OUT_OF_RANGE) until ControllerExpandVolume grew the
    volume; then the mounter sends NodeExpandVolume for the allocation's target and
    returns the new capacity; an allocation without the volume is refused by kubevol."""
    socket_path = hostpath_driver()
    registry.register(
        RegisteredPlugin(
            type=PluginType.CSI_NODE, name="hostpath", alloc_id="plugin-alloc",
            socket_path=socket_path, mount_root=str(tmp_path / "root"),
        )
    )  # fmt: skip
    with CSIClient(socket_path, timeout=20) as client:
        created = client.create_volume(
            "data", [CAP], capacity_range=t.CapacityRange(required_bytes=MiB)
        )
        volume = CSIVolume(id="data", remote_id=created.volume_id)
        mounter: NodeController = manager.mounter_for_plugin("hostpath", timeout=20)
        mounter.mount_volume(volume, "alloc-a", USAGE)
        grow = t.CapacityRange(required_bytes=2 * MiB)
        with pytest.raises(CSIRPCError) as refused:
            mounter.expand_volume("data", created.volume_id, "alloc-a", USAGE, grow)
        assert refused.value.code is StatusCode.OUT_OF_RANGE
        client.controller_expand_volume(created.volume_id, grow)
    assert mounter.expand_volume("data", created.volume_id, "alloc-a", USAGE, grow) == 2 * MiB
    expanded = [e for e in events if e.message == "Expand volume"]
    assert [e.details["success"] for e in expanded] == ["false", "true"]
    with pytest.raises(VolumeNotPublishedError, match="alloc-b"):
        mounter.expand_volume("data", created.volume_id, "alloc-b", USAGE, grow)
    mounter.unmount_volume("data", created.volume_id, "alloc-a", USAGE)


def test_a_plugin_without_node_expansion_is_refused_before_any_call(
    plugins: PluginFactory, registry: PluginRegistry, manager: CSIManager, tmp_path: Path
) -> None:
    """A node plugin that does not advertise EXPAND_VOLUME gets no NodeExpandVolume: the
    mounter raises ExpansionNotSupportedError."""
    proc = plugins("plain")
    registry.register(proc.registration(tmp_path / "root"))
    mounter = manager.mounter_for_plugin("plain", timeout=20)
    with pytest.raises(ExpansionNotSupportedError, match="EXPAND_VOLUME"):
        mounter.expand_volume("v", "", "alloc-a", USAGE, t.CapacityRange(required_bytes=MiB))
    assert proc.calls("NodeExpandVolume") == []
