"""Covers kubevol.nomad.attachment.

Waiting for a volume's attachment before mounting it: the controller publish happens
elsewhere (here a thread playing the server, calling the bundled hostpath driver's
ControllerPublishVolume over gRPC), the node agent waits for the publish context."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError, StatusCode
from kubevol.nomad import (
    AccessMode,
    AttachmentCancelledError,
    AttachmentRecords,
    AttachmentSource,
    AttachmentTimeoutError,
    AttachmentWaiter,
    CSIManager,
    CSIVolume,
    PluginRegistry,
    PluginType,
    RegisteredPlugin,
    UsageOptions,
)
from kubevol.testing.mount_rig import mounts_under
from tests.nomad.conftest import HostPathFactory

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

USAGE = UsageOptions(access_mode=AccessMode.SINGLE_NODE_WRITER)
CAP = t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_WRITER)


@pytest.fixture
def manager(registry: PluginRegistry, tmp_path: Path) -> Iterator[CSIManager]:
    """A running manager on the test registry, shut down afterwards."""
    mgr = CSIManager(registry, fingerprint_interval=0.5, state_dir=str(tmp_path / "state"))
    mgr.run()
    yield mgr
    mgr.shutdown()


def test_mount_waits_for_the_publish_context_made_elsewhere(
    hostpath_driver: HostPathFactory,
    registry: PluginRegistry,
    manager: CSIManager,
    tmp_path: Path,
) -> None:
    """A driver that needs ControllerPublish refuses to stage an unattached volume; the
    agent waits for the publish context the "server" records after publishing, then the
    mount with that context succeeds under the per-allocation layout."""
    socket_path = hostpath_driver("--enable-attach")
    root = tmp_path / "root"
    registry.register(
        RegisteredPlugin(
            type=PluginType.CSI_NODE, name="hostpath", alloc_id="plugin-alloc",
            socket_path=socket_path, mount_root=str(root),
        )
    )  # fmt: skip
    with CSIClient(socket_path, timeout=20) as client:
        created = client.create_volume("data", [CAP])
    volume = CSIVolume(id="data", remote_id=created.volume_id)
    mounter = manager.mounter_for_plugin("hostpath", timeout=20)
    assert mounter.node_id == "node-1"
    with pytest.raises(CSIRPCError) as refused:
        mounter.mount_volume(volume, "alloc-early", USAGE)
    assert refused.value.code is StatusCode.FAILED_PRECONDITION

    records = AttachmentRecords()

    def server() -> None:
        time.sleep(0.3)
        with CSIClient(socket_path, timeout=20) as client:
            context = client.controller_publish_volume(created.volume_id, "node-1", CAP)
        records.record(volume, "node-1", context)

    attacher = threading.Thread(target=server)
    attacher.start()
    started = time.monotonic()
    context = manager.attachment_waiter(records).wait_for_attachment(volume, mounter.node_id)
    attacher.join()
    assert time.monotonic() - started >= 0.3
    assert context == {"attached-to": "node-1"}
    info = mounter.mount_volume(volume, "alloc-a", USAGE, publish_context=context)
    assert info.source == str(root / "per-alloc" / "alloc-a" / "data" / USAGE.to_fs())
    assert info.source in mounts_under(root)
    mounter.unmount_volume("data", created.volume_id, "alloc-a", USAGE)
    assert mounts_under(root) == []


class Never(AttachmentSource):
    """A source that never has the attachment, counting how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    def publish_context(
        self, namespace: str, volume_id: str, node_id: str
    ) -> Mapping[str, str] | None:
        self.asked += 1
        return None


def test_the_wait_times_out_naming_the_volume_and_node() -> None:
    """No attachment within the timeout raises AttachmentTimeoutError (a TimeoutError)
    naming volume and node, after asking the source repeatedly."""
    source = Never()
    waiter = AttachmentWaiter(source, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="default/data on node node-1") as caught:
        waiter.wait_for_attachment(CSIVolume(id="data"), "node-1")
    assert isinstance(caught.value, AttachmentTimeoutError)
    assert 0.3 <= time.monotonic() - started < 2
    assert source.asked >= 3


def test_the_wait_is_cancelled_by_the_caller_and_by_manager_shutdown(
    registry: PluginRegistry,
) -> None:
    """A caller's cancel event ends its wait at once; shutting the manager down ends the
    waits of its waiters, well before their timeout."""
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(AttachmentCancelledError):
        AttachmentWaiter(Never(), timeout=60).wait_for_attachment(
            CSIVolume(id="data"), "node-1", cancel=cancel
        )
    assert time.monotonic() - started < 2

    mgr = CSIManager(registry)
    mgr.run()
    waiter = mgr.attachment_waiter(Never())
    assert waiter.timeout == mgr.retry.timeout
    threading.Timer(0.2, mgr.shutdown).start()
    started = time.monotonic()
    with pytest.raises(AttachmentCancelledError):
        waiter.wait_for_attachment(CSIVolume(id="data"), "node-1")
    assert time.monotonic() - started < 2


def test_records_hand_out_copies_and_forget_detached_volumes() -> None:
    """An empty publish context is an attachment; a forgotten one is not; names that would
    escape a path are refused."""
    records = AttachmentRecords()
    volume = CSIVolume(id="data", namespace="prod")
    assert records.publish_context("prod", "data", "node-1") is None
    records.record(volume, "node-1")
    assert records.publish_context("prod", "data", "node-1") == {}
    assert records.publish_context("default", "data", "node-1") is None
    records.forget(volume, "node-1")
    assert records.publish_context("prod", "data", "node-1") is None
    with pytest.raises(ValueError):
        records.record(volume, "../node")
