"""Covers kubevol.csi.client and kubevol.csi.errors.

CSIClient against the test driver over a real unix socket: every RPC and error mapping.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import NON_FINAL_CODES, CSIEndpointError, CSIRPCError, CSIRPCUncertainError
from kubevol.csidriver.server import serve_in_background
from kubevol.errors import UncertainProgressError, is_operation_finished
from kubevol.testing.csi_driver import NODE_ID
from kubevol.testing.waiting import wait_until
from kubevol.util.turns import Turns, given_up
from tests.csi.support import Served, ServeFactory, make_plugin

CAP = t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_WRITER, fs_type="ext4")
ALL_FAILURE_CODES = [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]


def test_identity_rpcs(served: Served) -> None:
    """GetPluginInfo, GetPluginCapabilities and Probe come back as attrs types."""
    c = served.client
    assert c.get_plugin_info() == t.PluginInfo(
        name="test.csi.kubevol.io", vendor_version="1.2.3", manifest={"k": "v"}
    )
    caps = c.get_plugin_capabilities()
    assert caps.services == {t.PluginServiceType.CONTROLLER_SERVICE}
    assert caps.volume_expansion == {t.VolumeExpansionType.ONLINE}
    assert c.probe() is True


def test_controller_volume_rpcs(served: Served) -> None:
    """Create, list, validate, publish, expand, modify and delete round-trip their data."""
    c = served.client
    vol = c.create_volume(
        "pvc-1",
        [CAP],
        capacity_range=t.CapacityRange(required_bytes=1 << 20),
        parameters={"type": "fast"},
        secrets={"password": "s"},
        content_source=t.SnapshotSource(snapshot_id="snap-0"),
        accessibility_requirements=t.TopologyRequirement(
            requisite=[t.Topology(segments={"zone": "z1"})]
        ),
    )
    assert vol == t.Volume(
        volume_id="id-pvc-1",
        capacity_bytes=1 << 20,
        volume_context={"type": "fast"},
        content_source=t.SnapshotSource(snapshot_id="snap-0"),
        accessible_topology=[t.Topology(segments={"zone": "z1"})],
    )
    page = c.list_volumes(max_entries=10)
    assert page.next_token == "more"
    assert page.entries[0].volume.volume_id == "id-pvc-1"
    assert page.entries[0].status == t.VolumeStatus(published_node_ids=(NODE_ID,))
    result = c.validate_volume_capabilities(vol.volume_id, [CAP], volume_context={"a": "b"})
    assert result.confirmed is not None
    assert result.confirmed.volume_capabilities == (CAP,)
    assert result.confirmed.volume_context == {"a": "b"}
    assert c.controller_publish_volume(vol.volume_id, "node-9", CAP) == {
        "device": "/dev/test",
        "node": "node-9",
    }
    c.controller_unpublish_volume(vol.volume_id, "node-9")
    expansion = c.controller_expand_volume(vol.volume_id, t.CapacityRange(required_bytes=5 << 20))
    assert expansion == t.ControllerExpansion(capacity_bytes=5 << 20, node_expansion_required=True)
    c.controller_modify_volume(vol.volume_id, {"iops": "100"})
    c.delete_volume(vol.volume_id)
    assert c.controller_get_capabilities() == {
        t.ControllerCapability.CREATE_DELETE_VOLUME,
        t.ControllerCapability.LIST_VOLUMES,
    }
    capacity = c.get_capacity(capabilities=[CAP], accessible_topology=t.Topology(segments={}))
    assert capacity == t.Capacity(available_capacity=1 << 40, maximum_volume_size=1 << 30)


def test_snapshot_and_group_rpcs(served: Served) -> None:
    """Snapshots keep their creation time (UTC); group snapshots list their members."""
    c = served.client
    snap = c.create_snapshot("vol-1", "daily")
    assert snap == t.Snapshot(
        snapshot_id="snap-daily",
        source_volume_id="vol-1",
        size_bytes=4096,
        creation_time=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        ready_to_use=True,
    )
    assert c.group_controller_get_capabilities() == {
        t.GroupControllerCapability.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT
    }
    group = c.create_volume_group_snapshot("g", ["a", "b"])
    assert group.group_snapshot_id == "group-g"
    assert [s.source_volume_id for s in group.snapshots] == ["a", "b"]
    assert all(s.group_snapshot_id == "group-g" for s in group.snapshots)


def test_node_rpcs(served: Served, tmp_path: Path) -> None:
    """Stage, publish (driver creates the target), stats, expand, unpublish (removes it)."""
    c = served.client
    staging = tmp_path / "staging"
    staging.mkdir()
    target = tmp_path / "pod" / "mount"
    c.node_stage_volume("v1", str(staging), CAP, publish_context={"device": "/dev/x"})
    c.node_publish_volume("v1", str(target), CAP, staging_target_path=str(staging))
    assert target.is_dir()
    stats = c.node_get_volume_stats("v1", str(target))
    usage = stats.by_unit(t.UsageUnit.BYTES)
    assert usage is not None
    assert usage.total > 0
    assert stats.volume_condition == t.VolumeCondition(abnormal=False, message="fine")
    assert (
        c.node_expand_volume("v1", str(target), capacity_range=t.CapacityRange(required_bytes=9))
        == 9
    )
    c.node_unpublish_volume("v1", str(target))
    assert not target.exists()
    c.node_unstage_volume("v1", str(staging))
    info = c.node_get_info()
    assert info == t.NodeInfo(
        node_id=NODE_ID,
        max_volumes_per_node=7,
        accessible_topology=t.Topology(segments={"zone": "z1"}),
    )
    with pytest.raises(CSIRPCError) as err:
        c.node_get_volume_stats("v1", str(tmp_path / "missing"))
    assert err.value.code is grpc.StatusCode.NOT_FOUND


def test_snapshot_metadata_streams_typed_chunks(served: Served) -> None:
    """GetMetadataAllocated streams chunks as attrs types; a mid-stream error is typed."""
    chunks = list(served.client.get_metadata_allocated("snap-1", starting_offset=100))
    assert [c.block_metadata for c in chunks] == [
        (t.BlockMetadata(byte_offset=100, size_bytes=4096),),
        (t.BlockMetadata(byte_offset=8292, size_bytes=4096),),
    ]
    assert chunks[0].block_metadata_type is t.BlockMetadataType.FIXED_LENGTH
    assert chunks[0].volume_capacity_bytes == 1 << 20
    stream = served.client.get_metadata_allocated("missing")
    assert next(stream).block_metadata[0].byte_offset == 0
    with pytest.raises(CSIRPCError) as err:
        list(stream)
    assert err.value.code is grpc.StatusCode.NOT_FOUND
    assert err.value.method == "/csi.v1.SnapshotMetadata/GetMetadataAllocated"
    with pytest.raises(CSIRPCError) as err2:
        list(served.client.get_metadata_delta("a", "b"))
    assert err2.value.code is grpc.StatusCode.UNIMPLEMENTED


def test_unimplemented_rpc_is_a_final_typed_error(served: Served) -> None:
    """A method the driver does not override answers UNIMPLEMENTED, named by method."""
    with pytest.raises(CSIRPCError) as err:
        served.client.delete_snapshot("snap-1")
    assert err.value.code is grpc.StatusCode.UNIMPLEMENTED
    assert err.value.method == "/csi.v1.Controller/DeleteSnapshot"
    assert not isinstance(err.value, UncertainProgressError)
    assert is_operation_finished(err.value)


@pytest.mark.parametrize("code", ALL_FAILURE_CODES, ids=str)
def test_publish_error_is_uncertain_exactly_for_non_final_codes(
    served: Served, tmp_path: Path, code: grpc.StatusCode
) -> None:
    """NodePublish failures are uncertain for the kubelet's non-final codes, final otherwise."""
    served.driver.fail["NodePublishVolume"] = (code, "boom")
    with pytest.raises(CSIRPCError) as err:
        served.client.node_publish_volume("v1", str(tmp_path / "t"), CAP)
    assert err.value.code is code
    assert err.value.message == "boom"
    assert isinstance(err.value, CSIRPCUncertainError) == (code in NON_FINAL_CODES)
    assert is_operation_finished(err.value) == (code not in NON_FINAL_CODES)


@pytest.mark.parametrize("code", sorted(NON_FINAL_CODES, key=str), ids=str)
def test_non_final_error_of_a_non_progressing_call_stays_plain(
    served: Served, tmp_path: Path, code: grpc.StatusCode
) -> None:
    """NodeUnpublish and Create/Delete failures are never uncertain, whatever the code."""
    served.driver.fail["NodeUnpublishVolume"] = (code, "busy")
    served.driver.fail["DeleteVolume"] = (code, "busy")
    with pytest.raises(CSIRPCError) as err:
        served.client.node_unpublish_volume("v1", str(tmp_path / "t"))
    assert err.value.code is code
    assert not isinstance(err.value, CSIRPCUncertainError)
    with pytest.raises(CSIRPCError) as err2:
        served.client.delete_volume("v1")
    assert not isinstance(err2.value, CSIRPCUncertainError)


def test_stage_expand_and_controller_publish_are_uncertain_on_aborted(
    served: Served, tmp_path: Path
) -> None:
    """Every stage, publish and expand call maps ABORTED to the uncertain variant."""
    b, c = served.driver, served.client
    for rpc in (
        "NodeStageVolume",
        "NodeExpandVolume",
        "ControllerPublishVolume",
        "ControllerExpandVolume",
    ):
        b.fail[rpc] = (grpc.StatusCode.ABORTED, "pending")
    calls: list[Callable[[], object]] = [
        lambda: c.node_stage_volume("v", str(tmp_path), CAP),
        lambda: c.node_expand_volume("v", str(tmp_path)),
        lambda: c.controller_publish_volume("v", "n", CAP),
        lambda: c.controller_expand_volume("v", t.CapacityRange(required_bytes=1)),
    ]
    for call in calls:
        with pytest.raises(CSIRPCUncertainError) as err:
            call()
        assert err.value.code is grpc.StatusCode.ABORTED


def test_deadline_exceeded_is_uncertain_for_stage(served: Served, tmp_path: Path) -> None:
    """A per-call timeout that expires during NodeStage raises the uncertain variant."""
    served.driver.sleep["NodeStageVolume"] = 2.0
    with pytest.raises(CSIRPCUncertainError) as err:
        served.client.node_stage_volume("v", str(tmp_path), CAP, timeout=0.2)
    assert err.value.code is grpc.StatusCode.DEADLINE_EXCEEDED


def test_nobody_listening_is_unavailable(tmp_path: Path) -> None:
    """With no server, publish is uncertain UNAVAILABLE and an identity call a plain error."""
    with CSIClient(f"unix://{tmp_path}/none.sock", timeout=2) as client:
        with pytest.raises(CSIRPCUncertainError) as err:
            client.node_publish_volume("v", str(tmp_path / "t"), CAP)
        assert err.value.code is grpc.StatusCode.UNAVAILABLE
        with pytest.raises(CSIRPCError) as err2:
            client.get_plugin_info()
        assert err2.value.code is grpc.StatusCode.UNAVAILABLE
        assert not isinstance(err2.value, CSIRPCUncertainError)


def test_transport_failure_outside_grpc_is_uncertain_for_publish(
    served: Served, tmp_path: Path
) -> None:
    """A non-gRPC failure (closed channel) is uncertain for publish, final for others."""
    client = CSIClient(served.handle.address)
    client.close()
    with pytest.raises(CSIRPCUncertainError) as err:
        client.node_publish_volume("v", str(tmp_path / "t"), CAP)
    assert err.value.code is grpc.StatusCode.UNKNOWN
    assert isinstance(err.value.__cause__, Exception)
    with pytest.raises(CSIRPCError) as err2:
        client.node_get_info()
    assert not isinstance(err2.value, CSIRPCUncertainError)


def test_node_capabilities_are_cached_until_refresh(served: Served) -> None:
    """node_get_capabilities asks once; refresh=True asks again and updates the cache."""
    b, c = served.driver, served.client
    assert c.node_get_capabilities() == {t.NodeCapability.STAGE_UNSTAGE_VOLUME}
    b.node_caps = {t.NodeCapability.GET_VOLUME_STATS}
    assert c.node_get_capabilities() == {t.NodeCapability.STAGE_UNSTAGE_VOLUME}
    assert b.calls.count("NodeGetCapabilities") == 1
    assert c.node_get_capabilities(refresh=True) == {t.NodeCapability.GET_VOLUME_STATS}
    assert c.node_supports(t.NodeCapability.GET_VOLUME_STATS)
    assert b.calls.count("NodeGetCapabilities") == 2


def test_metadata_and_user_agent_reach_the_driver(serve_driver: ServeFactory) -> None:
    """Client-wide and per-call metadata are sent; the user agent names kubevol."""
    served = serve_driver()
    with CSIClient(
        served.handle.address, metadata={"x-agent": "node-a"}, user_agent="agent/1"
    ) as c:
        c.node_get_info(metadata={"csi.requestid": "req-42"})
    seen = served.driver.seen_metadata[-1]
    assert seen["csi.requestid"] == "req-42"
    assert seen["x-agent"] == "node-a"
    assert seen["user-agent"].startswith("agent/1")


def test_bare_path_and_tcp_endpoints(serve_driver: ServeFactory, tmp_path: Path) -> None:
    """A bare socket path works like unix://, and tcp://127.0.0.1 works for tests."""
    served = serve_driver()
    with CSIClient(str(tmp_path / "csi.sock")) as c:
        assert c.get_plugin_info().name == "test.csi.kubevol.io"
    plugin, _ = make_plugin()
    handle = serve_in_background(plugin, "tcp://127.0.0.1:0", env={})
    try:
        assert handle.address.startswith("tcp://127.0.0.1:")
        assert not handle.address.endswith(":0")
        with CSIClient(handle.address) as c:
            assert c.node_get_info().node_id == NODE_ID
    finally:
        handle.stop(grace=1)
    assert served.client.probe()


@pytest.mark.parametrize(
    "endpoint", ["", "relative.sock", "http://x:1", "tcp://nohost", "unix://rel/x.sock"]
)
def test_bad_endpoints_are_rejected(endpoint: str) -> None:
    """Endpoints that are not unix://ABS, tcp://HOST:PORT or an absolute path raise."""
    with pytest.raises(CSIEndpointError):
        CSIClient(endpoint)


def test_client_is_a_context_manager(served: Served) -> None:
    """Leaving the with-block closes the channel; close() is idempotent."""
    with CSIClient(served.handle.address) as c:
        assert c.probe()
    c.close()
    with pytest.raises(CSIRPCError):
        c.probe()


def test_client_talks_to_a_server_not_built_on_kubevol(tmp_path: Path) -> None:
    """The client works against a plain generated servicer, as it would against any driver."""
    import importlib
    from concurrent import futures

    csi_grpc: Any = importlib.import_module("kubevol.csi._generated.csi_pb2_grpc")

    class PlainNode(csi_grpc.NodeServicer):  # type: ignore[misc]  # generated, untyped base
        def NodeGetInfo(self, request: Any, context: Any) -> Any:
            return csi_pb2.NodeGetInfoResponse(node_id="plain-node")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    csi_grpc.add_NodeServicer_to_server(PlainNode(), server)
    server.add_insecure_port(f"unix://{tmp_path}/plain.sock")
    server.start()
    try:
        with CSIClient(f"unix://{tmp_path}/plain.sock") as client:
            assert client.node_get_info().node_id == "plain-node"
            with pytest.raises(CSIRPCError) as err:
                client.node_stage_volume("v", str(tmp_path), CAP)
            assert err.value.code is grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(None)


def test_a_call_gives_its_threads_turn_up_while_the_driver_works(
    served: Served, tmp_path: Path
) -> None:
    """A client made with ``around_call=given_up`` (as the node layer makes them) lets another
    operation do its local work while it waits on a driver (kubevol.util.turns): the other
    thread gets the turn although the call is still blocked in the driver, long before the
    patience (30 s) is over."""
    turns = Turns(patience=30)
    client = CSIClient(served.handle.address, timeout=20, around_call=given_up)
    gate, entered = threading.Event(), threading.Event()
    served.driver.block["NodeUnpublishVolume"] = gate
    served.driver.entered["NodeUnpublishVolume"] = entered

    def operation() -> None:
        with turns.take():
            client.node_unpublish_volume("v1", str(tmp_path / "t"))

    thread = threading.Thread(target=operation)
    thread.start()
    try:
        assert entered.wait(10)
        started = time.monotonic()
        with turns.take():
            waited = time.monotonic() - started
    finally:
        gate.set()
        thread.join(10)
        client.close()
    assert waited < 5
    assert served.driver.calls.count("NodeUnpublishVolume") == 1


def test_a_channel_closed_for_being_idle_opens_again_on_the_next_call(served: Served) -> None:
    """``close_if_idle`` closes the channel only after ``idle_for`` seconds without a call;
    the next call opens a new one and is answered, unary, streamed or started alike."""
    client = served.client
    assert client.probe() and client.channel_open
    assert client.close_if_idle(60) is False
    assert client.channel_open
    assert client.close_if_idle(0) is True
    assert not client.channel_open
    assert client.close_if_idle(0) is False  # nothing left to close
    assert client.probe()
    assert client.channel_open
    assert client.close_if_idle(0)
    assert len(list(client.get_metadata_allocated("snap-1"))) == 2
    assert client.close_if_idle(0)
    started = client.node_get_volume_stats_started("v1", "/nowhere")
    wait_until(started.done, 10, "the started call answered")
    with pytest.raises(CSIRPCError):  # the test driver knows no such volume: answered
        started.outcome()
    assert served.driver.calls.count("NodeGetVolumeStats") == 1


@pytest.mark.parametrize("how", ["blocking", "started"])
def test_a_channel_is_not_closed_for_being_idle_under_a_call(
    served: Served, tmp_path: Path, how: str
) -> None:
    """A call in flight (waited for, or started and not answered yet) keeps the channel
    open, however long it takes; once it ended, the idle time counts from its end."""
    client = served.client
    gate, entered = threading.Event(), threading.Event()
    served.driver.block["NodeGetVolumeStats"] = gate
    served.driver.entered["NodeGetVolumeStats"] = entered
    answered = threading.Event()
    if how == "started":
        started = client.node_get_volume_stats_started("v1", str(tmp_path))
        started.when_done(answered.set)
    else:
        def blocking() -> None:
            with contextlib.suppress(CSIRPCError):
                client.node_get_volume_stats("v1", str(tmp_path))
            answered.set()
        threading.Thread(target=blocking, daemon=True).start()
    try:
        assert entered.wait(10)
        assert client.close_if_idle(0) is False
        assert client.channel_open
    finally:
        gate.set()
    assert answered.wait(10)
    wait_until(lambda: client.close_if_idle(0.2), 10, "the channel closed once idle")
    assert client.probe()


def test_a_closed_client_is_not_opened_again(served: Served) -> None:
    """After ``close()`` nothing reopens the channel: calls fail as on a closed channel,
    started ones too, and there is nothing to close for being idle."""
    client = served.client
    assert client.close_if_idle(0)
    client.close()
    assert client.close_if_idle(0) is False
    with pytest.raises(CSIRPCError, match="closed"):
        client.probe()
    with pytest.raises(CSIRPCError, match="closed"):
        client.node_get_volume_stats_started("v1", "/nowhere")
    assert not client.channel_open
