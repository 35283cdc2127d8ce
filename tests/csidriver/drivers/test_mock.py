"""Covers kubevol.csidriver.drivers.mock.

The mock driver answers every RPC as the CSI spec says, over a real unix socket.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.engine.rpc import make_token, paginate, read_token
from kubevol.csidriver.drivers.mock import MockConfig, parse_capabilities
from tests.csidriver.drivers.conftest import Served

MOUNT = t.VolumeCapability.mount()
BLOCK = t.VolumeCapability.block()
MiB = 1 << 20

MockFactory = Callable[..., Served]


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``call`` fails with."""
    with pytest.raises(CSIRPCError) as info:
        call()
    return info.value.code


#: Every controller capability, GET_SNAPSHOT (opt-in) included.
ALL_CONTROLLER = parse_capabilities(t.ControllerCapability, "all")


@pytest.fixture
def mock(mock_factory: MockFactory) -> CSIClient:
    """A client of a mock driver with every capability (attach and GetSnapshot included)."""
    return mock_factory(controller_caps=ALL_CONTROLLER).client


@pytest.fixture
def simple(mock_factory: MockFactory) -> CSIClient:
    """A mock without ControllerPublish, so node calls need no attachment."""
    caps = ALL_CONTROLLER - {t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME}
    return mock_factory(controller_caps=caps).client


def test_defaults_leave_out_what_csi_sanity_does_not_know(mock_factory: MockFactory) -> None:
    """By default the mock advertises every controller capability but GET_SNAPSHOT, whose
    number upstream csi-sanity rejects; asking for it turns GetSnapshot on."""
    c = mock_factory().client
    caps = c.controller_get_capabilities()
    assert t.ControllerCapability.GET_SNAPSHOT not in caps
    assert caps == ALL_CONTROLLER - {t.ControllerCapability.GET_SNAPSHOT}
    assert code_of(lambda: c.get_snapshot("s")) == grpc.StatusCode.UNIMPLEMENTED


def test_pages_follow_tokens_and_survive_deletions(mock: CSIClient) -> None:
    """Pages cover every volume once, even when the last volume of a page is deleted."""
    ids = {mock.create_volume(f"v{i}", [MOUNT]).volume_id for i in range(5)}
    first = mock.list_volumes(max_entries=2)
    assert len(first.entries) == 2 and first.next_token
    mock.delete_volume(first.entries[-1].volume.volume_id)
    seen = [e.volume.volume_id for e in first.entries]
    token = first.next_token
    while token:
        page = mock.list_volumes(max_entries=2, starting_token=token)
        seen += [e.volume.volume_id for e in page.entries]
        token = page.next_token
    assert len(seen) == len(set(seen)) == 5 and set(seen) == ids


def test_unknown_token_is_aborted(mock: CSIClient) -> None:
    """A token the driver did not issue answers ABORTED (gocsi's mock: INVALID_ARGUMENT)."""
    assert code_of(lambda: mock.list_volumes(starting_token="invalid-token")) == (
        grpc.StatusCode.ABORTED
    )
    assert code_of(lambda: mock.list_snapshots(starting_token="10")) == grpc.StatusCode.ABORTED


def test_paginate_unit() -> None:
    """Tokens round-trip; a negative max_entries is INVALID_ARGUMENT."""
    assert read_token(make_token("abc")) == "abc"
    page, token = paginate(["c", "a", "b"], str, 2, "")
    assert page == ["a", "b"] and read_token(token) == "b"
    assert paginate(["c", "a", "b"], str, 0, token) == (["c"], "")
    with pytest.raises(CSIRPCError) as info:
        paginate(["a"], str, -1, "")
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_same_name_is_idempotent_or_already_exists(mock: CSIClient) -> None:
    """The same name with the same arguments answers the same volume; with another size,
    other parameters or another access type, ALREADY_EXISTS."""
    rng = t.CapacityRange(required_bytes=10 * MiB)
    vol = mock.create_volume("same", [MOUNT], capacity_range=rng, parameters={"a": "1"})
    assert mock.create_volume("same", [MOUNT], capacity_range=rng, parameters={"a": "1"}) == vol
    bigger = t.CapacityRange(required_bytes=20 * MiB, limit_bytes=20 * MiB)
    for call in (
        lambda: mock.create_volume("same", [MOUNT], capacity_range=bigger, parameters={"a": "1"}),
        lambda: mock.create_volume("same", [MOUNT], capacity_range=rng, parameters={"a": "2"}),
        lambda: mock.create_volume("same", [BLOCK], capacity_range=rng, parameters={"a": "1"}),
    ):
        assert code_of(call) == grpc.StatusCode.ALREADY_EXISTS
    assert mock.create_volume("x" * 128, [MOUNT]).volume_id


def test_capacity_range_rules(mock: CSIClient) -> None:
    """An inverted range and a size over the maximum are OUT_OF_RANGE; no range gives the
    default size; capacity shrinks as volumes are created."""
    inverted = t.CapacityRange(required_bytes=2 * MiB, limit_bytes=MiB)
    assert code_of(lambda: mock.create_volume("inv", [MOUNT], capacity_range=inverted)) == (
        grpc.StatusCode.OUT_OF_RANGE
    )
    huge = t.CapacityRange(required_bytes=1 << 50)
    assert code_of(lambda: mock.create_volume("huge", [MOUNT], capacity_range=huge)) == (
        grpc.StatusCode.OUT_OF_RANGE
    )
    before = mock.get_capacity().available_capacity
    assert mock.create_volume("dflt", [MOUNT]).capacity_bytes == 1 << 30
    assert mock.get_capacity().available_capacity == before - (1 << 30)
    assert mock.create_volume("capped", [MOUNT], capacity_range=t.CapacityRange(limit_bytes=MiB))
    assert mock.get_capacity(capabilities=[t.VolumeCapability.mount()]).available_capacity > 0


def test_snapshots_have_real_ids(mock: CSIClient) -> None:
    """Each snapshot gets its own id; same name and source is idempotent, another source
    ALREADY_EXISTS; unknown snapshots: delete OK, get NOT_FOUND, list empty."""
    vol = mock.create_volume("v", [MOUNT])
    other = mock.create_volume("w", [MOUNT])
    a = mock.create_snapshot(vol.volume_id, "a")
    b = mock.create_snapshot(vol.volume_id, "b")
    assert a.snapshot_id != b.snapshot_id and a.creation_time is not None
    assert mock.create_snapshot(vol.volume_id, "a") == a
    assert mock.get_snapshot(a.snapshot_id) == a
    assert code_of(lambda: mock.create_snapshot(other.volume_id, "a")) == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    assert code_of(lambda: mock.create_snapshot("nope", "c")) == grpc.StatusCode.NOT_FOUND
    mock.delete_snapshot("unknown")
    assert code_of(lambda: mock.get_snapshot("unknown")) == grpc.StatusCode.NOT_FOUND
    assert mock.list_snapshots(snapshot_id="unknown").entries == ()
    assert mock.list_snapshots(source_volume_id=vol.volume_id).entries == tuple(
        sorted((a, b), key=lambda s: s.snapshot_id)
    )
    restored = mock.create_volume(
        "r", [MOUNT], content_source=t.SnapshotSource(snapshot_id=a.snapshot_id)
    )
    assert restored.content_source == t.SnapshotSource(snapshot_id=a.snapshot_id)
    missing = t.SnapshotSource(snapshot_id="gone")
    assert code_of(lambda: mock.create_volume("r2", [MOUNT], content_source=missing)) == (
        grpc.StatusCode.NOT_FOUND
    )


def test_staging_rules(simple: CSIClient, tmp_path: Path) -> None:
    """Publishing needs staging at that path; staging elsewhere is FAILED_PRECONDITION,
    with another capability ALREADY_EXISTS; unstaging while published FAILED_PRECONDITION."""
    vol = simple.create_volume("v", [MOUNT]).volume_id
    staging, target = str(tmp_path / "s"), str(tmp_path / "t")
    (tmp_path / "s").mkdir()
    (tmp_path / "o").mkdir()
    assert code_of(lambda: simple.node_publish_volume(vol, target, MOUNT)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    simple.node_stage_volume(vol, staging, MOUNT)
    simple.node_stage_volume(vol, staging, MOUNT)
    assert code_of(lambda: simple.node_stage_volume(vol, str(tmp_path / "o"), MOUNT)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    ro = t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_READER_ONLY)
    assert code_of(lambda: simple.node_stage_volume(vol, staging, ro)) == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    simple.node_publish_volume(vol, target, MOUNT, staging_target_path=staging)
    assert (
        code_of(
            lambda: simple.node_publish_volume(
                vol, target, MOUNT, staging_target_path=staging, readonly=True
            )
        )
        == grpc.StatusCode.ALREADY_EXISTS
    )
    assert code_of(lambda: simple.node_unstage_volume(vol, staging)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    assert code_of(lambda: simple.node_publish_volume(vol, "relative", MOUNT)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    simple.node_unpublish_volume(vol, target)
    simple.node_unstage_volume(vol, staging)


def test_not_found_and_ok_where_the_spec_says(mock: CSIClient, tmp_path: Path) -> None:
    """Teardown of unknown things is OK; reading or using an unknown volume is NOT_FOUND."""
    mock.delete_volume("unknown")
    mock.controller_unpublish_volume("unknown", "node-1")
    mock.node_unpublish_volume("unknown", str(tmp_path / "t"))
    mock.node_unstage_volume("unknown", str(tmp_path / "s"))
    not_found = [
        lambda: mock.node_get_volume_stats("unknown", "some/path"),
        lambda: mock.node_publish_volume("unknown", str(tmp_path / "t"), MOUNT),
        lambda: mock.node_stage_volume("unknown", str(tmp_path / "s"), MOUNT),
        lambda: mock.validate_volume_capabilities("unknown", [MOUNT]),
        lambda: mock.controller_expand_volume("unknown", t.CapacityRange(required_bytes=1)),
        lambda: mock.controller_get_volume("unknown"),
        lambda: mock.controller_modify_volume("unknown", {"iops": "10"}),
        lambda: mock.node_expand_volume("unknown", "some/path"),
        lambda: mock.controller_publish_volume("unknown", "node-1", MOUNT),
    ]
    for call in not_found:
        assert code_of(call) == grpc.StatusCode.NOT_FOUND
    vol = mock.create_volume("v", [MOUNT]).volume_id
    assert code_of(lambda: mock.node_get_volume_stats(vol, "some/path")) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert code_of(lambda: mock.controller_publish_volume(vol, "node-2", MOUNT)) == (
        grpc.StatusCode.NOT_FOUND
    )


REQUIRED: list[tuple[str, object]] = [
    ("CreateVolume", csi_pb2.CreateVolumeRequest(name="x")),
    ("CreateVolume", csi_pb2.CreateVolumeRequest()),
    ("DeleteVolume", csi_pb2.DeleteVolumeRequest()),
    ("ControllerPublishVolume", csi_pb2.ControllerPublishVolumeRequest(volume_id="v")),
    ("ControllerUnpublishVolume", csi_pb2.ControllerUnpublishVolumeRequest()),
    ("ValidateVolumeCapabilities", csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id="v")),
    ("CreateSnapshot", csi_pb2.CreateSnapshotRequest(name="s")),
    ("DeleteSnapshot", csi_pb2.DeleteSnapshotRequest()),
    ("GetSnapshot", csi_pb2.GetSnapshotRequest()),
    ("ControllerExpandVolume", csi_pb2.ControllerExpandVolumeRequest(volume_id="v")),
    ("ControllerGetVolume", csi_pb2.ControllerGetVolumeRequest()),
    (
        "ControllerModifyVolume",
        csi_pb2.ControllerModifyVolumeRequest(mutable_parameters={"iops": "1"}),
    ),
    ("NodeStageVolume", csi_pb2.NodeStageVolumeRequest(volume_id="v", staging_target_path="/s")),
    ("NodeUnstageVolume", csi_pb2.NodeUnstageVolumeRequest(volume_id="v")),
    ("NodePublishVolume", csi_pb2.NodePublishVolumeRequest(volume_id="v", target_path="/t")),
    ("NodeUnpublishVolume", csi_pb2.NodeUnpublishVolumeRequest(target_path="/t")),
    ("NodeGetVolumeStats", csi_pb2.NodeGetVolumeStatsRequest(volume_id="v")),
    ("NodeExpandVolume", csi_pb2.NodeExpandVolumeRequest(volume_path="/t")),
    ("CreateVolumeGroupSnapshot", csi_pb2.CreateVolumeGroupSnapshotRequest(name="g")),
    ("DeleteVolumeGroupSnapshot", csi_pb2.DeleteVolumeGroupSnapshotRequest()),
]


@pytest.mark.parametrize(("rpc", "request_msg"), REQUIRED, ids=[r for r, _ in REQUIRED])
def test_missing_required_fields_are_invalid(
    mock: CSIClient, rpc: str, request_msg: Message
) -> None:
    """A request without a field the spec requires answers INVALID_ARGUMENT."""
    assert code_of(lambda: mock.call(rpc, request_msg)) == grpc.StatusCode.INVALID_ARGUMENT


def test_capabilities_switch_rpcs_off(mock_factory: MockFactory, tmp_path: Path) -> None:
    """An RPC whose capability is switched off answers UNIMPLEMENTED; without staging,
    publishing needs no staging path."""
    c = mock_factory(
        controller_caps=frozenset({t.ControllerCapability.CREATE_DELETE_VOLUME}),
        node_caps=frozenset(),
        group_caps=frozenset(),
    ).client
    assert c.controller_get_capabilities() == {t.ControllerCapability.CREATE_DELETE_VOLUME}
    assert c.node_get_capabilities() == frozenset()
    vol = c.create_volume("v", [MOUNT]).volume_id
    for call in (
        c.list_volumes,
        lambda: c.create_snapshot(vol, "s"),
        lambda: c.node_stage_volume(vol, str(tmp_path), MOUNT),
        lambda: c.node_get_volume_stats(vol, str(tmp_path)),
        lambda: c.create_volume_group_snapshot("g", [vol]),
    ):
        assert code_of(call) == grpc.StatusCode.UNIMPLEMENTED
    c.node_publish_volume(vol, str(tmp_path / "t"), MOUNT)
    c.node_unpublish_volume(vol, str(tmp_path / "t"))


def test_parse_capabilities() -> None:
    """Capability lists accept names, numbers, none and all; unknown names are errors."""
    node = t.NodeCapability
    assert parse_capabilities(node, "stage_unstage_volume,2") == {
        node.STAGE_UNSTAGE_VOLUME,
        node.GET_VOLUME_STATS,
    }
    assert parse_capabilities(node, "none") == frozenset()
    assert node.EXPAND_VOLUME in parse_capabilities(node, "all")
    with pytest.raises(ValueError, match="bogus"):
        parse_capabilities(node, "bogus")


def test_mock_mount_creates_and_removes_targets_only(
    mock_factory: MockFactory, tmp_path: Path
) -> None:
    """With mock_mount, publish creates the target (a file for block) and unpublish removes
    it; without it, nothing is created."""
    caps = MockConfig().controller_caps - {t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME}
    for mock_mount in (True, False):
        c = mock_factory(mock_mount=mock_mount, controller_caps=caps).client
        for cap in (MOUNT, BLOCK):
            vol = c.create_volume(f"v-{cap.access_type}", [cap]).volume_id
            staging = str(tmp_path / f"s-{mock_mount}")
            os.makedirs(staging, exist_ok=True)
            target = str(tmp_path / f"pods-{mock_mount}" / vol)
            c.node_stage_volume(vol, staging, cap)
            c.node_publish_volume(vol, target, cap, staging_target_path=staging)
            assert os.path.lexists(target) is mock_mount
            if mock_mount:
                assert os.path.isdir(target) is (cap is MOUNT)
            c.node_unpublish_volume(vol, target)
            assert not os.path.lexists(target)
            c.node_unstage_volume(vol, staging)


def test_group_snapshots(mock: CSIClient) -> None:
    """A group snapshot cuts one member per volume; it is idempotent by name, members
    cannot be deleted alone, deleting the group deletes them."""
    vols = [mock.create_volume(f"g{i}", [MOUNT]).volume_id for i in range(2)]
    group = mock.create_volume_group_snapshot("grp", vols)
    assert {s.source_volume_id for s in group.snapshots} == set(vols)
    assert all(s.group_snapshot_id == group.group_snapshot_id for s in group.snapshots)
    assert mock.create_volume_group_snapshot("grp", list(reversed(vols))) == group
    assert code_of(lambda: mock.create_volume_group_snapshot("grp", vols[:1])) == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    member_ids = [s.snapshot_id for s in group.snapshots]
    assert mock.get_volume_group_snapshot(group.group_snapshot_id, member_ids) == group
    assert code_of(lambda: mock.delete_snapshot(member_ids[0])) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    mock.delete_volume_group_snapshot(group.group_snapshot_id, member_ids)
    mock.delete_volume_group_snapshot(group.group_snapshot_id, member_ids)
    assert code_of(lambda: mock.get_snapshot(member_ids[0])) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: mock.get_volume_group_snapshot(group.group_snapshot_id, [])) == (
        grpc.StatusCode.NOT_FOUND
    )


def test_modify_validate_and_attach(mock: CSIClient, tmp_path: Path) -> None:
    """Modify takes the mock's known keys only, an empty map is a no-op, an unknown volume
    NOT_FOUND; validate confirms matching capabilities only; attach is idempotent and
    conflicting attach flags are ALREADY_EXISTS."""
    vol = mock.create_volume("m", [MOUNT], parameters={"p": "1"}).volume_id
    mock.controller_modify_volume(vol, {"iops": "100"})
    mock.controller_modify_volume(vol, {})
    assert code_of(lambda: mock.controller_modify_volume("nope", {})) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: mock.controller_modify_volume(vol, {"XXX_FakeKey": "1"})) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert code_of(
        lambda: mock.create_volume("bad-vac", [MOUNT], mutable_parameters={"XXX": "1"})
    ) == (grpc.StatusCode.INVALID_ARGUMENT)
    (tmp_path / "s").mkdir()
    assert mock.validate_volume_capabilities(vol, [MOUNT]).confirmed is not None
    refused = mock.validate_volume_capabilities(vol, [BLOCK])
    assert refused.confirmed is None and "block" in refused.message
    assert mock.validate_volume_capabilities(vol, [MOUNT], parameters={"p": "2"}).confirmed is None
    ctx = mock.controller_publish_volume(vol, "node-1", MOUNT)
    assert mock.controller_publish_volume(vol, "node-1", MOUNT) == ctx
    assert code_of(lambda: mock.controller_publish_volume(vol, "node-1", MOUNT, readonly=True)) == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    [entry] = [e for e in mock.list_volumes().entries if e.volume.volume_id == vol]
    assert entry.status is not None and entry.status.published_node_ids == ("node-1",)
    mock.node_stage_volume(vol, str(tmp_path / "s"), MOUNT)
    assert code_of(lambda: mock.delete_volume(vol)) == grpc.StatusCode.FAILED_PRECONDITION
    mock.node_unstage_volume(vol, str(tmp_path / "s"))
    mock.controller_unpublish_volume(vol, "node-1")
    mock.delete_volume(vol)
