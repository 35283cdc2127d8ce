"""Snapshots: create, delete, list, get, and volumes restored from them."""

from __future__ import annotations

from functools import partial

from kubevol.csi import pb
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.sanity.checks import Code, expect_code, need_controller
from kubevol.csidriver.sanity.context import Resources, SanityContext, repeat, unique_name

CC = t.ControllerCapability


def test_create_snapshot_requires_fields(csi_sanity: SanityContext) -> None:
    """CreateSnapshot without a name or a source volume is INVALID_ARGUMENT."""
    need_controller(csi_sanity, CC.CREATE_DELETE_SNAPSHOT)
    c = csi_sanity.controller
    secrets = csi_sanity.secrets("CreateSnapshot")
    for req in (
        csi_pb2.CreateSnapshotRequest(source_volume_id="v", secrets=secrets),
        csi_pb2.CreateSnapshotRequest(name=unique_name("s"), secrets=secrets),
    ):
        expect_code(Code.INVALID_ARGUMENT, partial(c.call, "CreateSnapshot", req))


def test_create_snapshot_is_idempotent(csi_resources: Resources) -> None:
    """The same name and source answer the same snapshot, with a creation time and a
    source; a 128-character name works."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    vol = csi_resources.create_volume()
    name = "s" * 128
    snap = repeat(
        ctx.config.idempotent_count, lambda: csi_resources.create_snapshot(vol.volume_id, name)
    )
    assert snap.snapshot_id and snap.source_volume_id == vol.volume_id
    assert snap.creation_time is not None


def test_snapshot_ids_are_unique(csi_resources: Resources) -> None:
    """Two snapshots get two ids (gocsi's mock answered the same id every time)."""
    need_controller(csi_resources.ctx, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    vol = csi_resources.create_volume()
    a = csi_resources.create_snapshot(vol.volume_id)
    b = csi_resources.create_snapshot(vol.volume_id)
    assert a.snapshot_id != b.snapshot_id


def test_same_name_other_source_already_exists(csi_resources: Resources) -> None:
    """A snapshot name reused for another volume is ALREADY_EXISTS; an unknown source
    volume is NOT_FOUND."""
    need_controller(csi_resources.ctx, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    a, b = csi_resources.create_volume(), csi_resources.create_volume()
    name = unique_name("snap")
    csi_resources.create_snapshot(a.volume_id, name)
    expect_code(Code.ALREADY_EXISTS, lambda: csi_resources.create_snapshot(b.volume_id, name))
    expect_code(Code.NOT_FOUND, lambda: csi_resources.create_snapshot(unique_name("none")))


def test_delete_snapshot(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """DeleteSnapshot needs an id, answers OK for an unknown one and is idempotent."""
    need_controller(csi_sanity, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    secrets = csi_sanity.secrets("DeleteSnapshot")
    req = csi_pb2.DeleteSnapshotRequest(secrets=secrets)
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("DeleteSnapshot", req))
    c.delete_snapshot(unique_name("never"), secrets=secrets)
    snap = csi_resources.create_snapshot(csi_resources.create_volume().volume_id)
    repeat(
        csi_sanity.config.idempotent_count,
        lambda: c.delete_snapshot(snap.snapshot_id, secrets=secrets),
    )


def test_list_snapshots_filters(csi_resources: Resources) -> None:
    """ListSnapshots finds a snapshot by id and by source; unknown filters give an empty
    list, an unknown token ABORTED."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.LIST_SNAPSHOTS, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    c = ctx.controller
    vol = csi_resources.create_volume()
    snap = csi_resources.create_snapshot(vol.volume_id)
    secrets = ctx.secrets("ListSnapshots")
    by_id = c.list_snapshots(snapshot_id=snap.snapshot_id, secrets=secrets).entries
    assert [s.snapshot_id for s in by_id] == [snap.snapshot_id]
    by_source = c.list_snapshots(source_volume_id=vol.volume_id, secrets=secrets).entries
    assert snap.snapshot_id in {s.snapshot_id for s in by_source}
    assert c.list_snapshots(snapshot_id=unique_name("none"), secrets=secrets).entries == ()
    assert c.list_snapshots(source_volume_id=unique_name("none"), secrets=secrets).entries == ()
    expect_code(Code.ABORTED, lambda: c.list_snapshots(starting_token="invalid-token"))


def test_list_snapshots_entries_and_deletion(csi_resources: Resources) -> None:
    """Every listed snapshot has an id, a source and a creation time; a deleted snapshot is
    no longer listed."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.LIST_SNAPSHOTS, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    c = ctx.controller
    secrets = ctx.secrets("ListSnapshots")
    snap = csi_resources.create_snapshot(csi_resources.create_volume().volume_id)
    raw = c.call("ListSnapshots", csi_pb2.ListSnapshotsRequest(secrets=secrets))
    assert isinstance(raw, pb.ListSnapshotsResponse), type(raw)
    for entry in raw.entries:
        s = entry.snapshot
        assert s.snapshot_id and s.source_volume_id and s.HasField("creation_time"), s
    assert snap.snapshot_id in {e.snapshot.snapshot_id for e in raw.entries}
    c.delete_snapshot(snap.snapshot_id, secrets=ctx.secrets("DeleteSnapshot"))
    assert c.list_snapshots(snapshot_id=snap.snapshot_id, secrets=secrets).entries == ()


def test_list_snapshots_pages(csi_resources: Resources) -> None:
    """max_entries limits a page and next_token continues without repeats."""
    ctx = csi_resources.ctx
    need_controller(ctx, CC.LIST_SNAPSHOTS, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    vol = csi_resources.create_volume()
    made = {csi_resources.create_snapshot(vol.volume_id).snapshot_id for _ in range(3)}
    seen: list[str] = []
    token = ""
    for _ in range(1000):
        page = ctx.controller.list_snapshots(max_entries=2, starting_token=token)
        assert len(page.entries) <= 2
        seen += [s.snapshot_id for s in page.entries]
        token = page.next_token
        if not token:
            break
    assert len(seen) == len(set(seen)) and made <= set(seen)


def test_get_snapshot(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """GetSnapshot needs an id, answers a created snapshot, NOT_FOUND for an unknown one."""
    need_controller(csi_sanity, CC.GET_SNAPSHOT, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    secrets = csi_sanity.secrets("GetSnapshot")
    expect_code(Code.INVALID_ARGUMENT, lambda: c.call("GetSnapshot", csi_pb2.GetSnapshotRequest()))
    snap = csi_resources.create_snapshot(csi_resources.create_volume().volume_id)
    assert c.get_snapshot(snap.snapshot_id, secrets=secrets).snapshot_id == snap.snapshot_id
    expect_code(Code.NOT_FOUND, lambda: c.get_snapshot(unique_name("none"), secrets=secrets))


def test_volume_from_snapshot(csi_resources: Resources) -> None:
    """A volume created from a snapshot names it as its content source."""
    need_controller(csi_resources.ctx, CC.CREATE_DELETE_SNAPSHOT, CC.CREATE_DELETE_VOLUME)
    snap = csi_resources.create_snapshot(csi_resources.create_volume().volume_id)
    source = t.SnapshotSource(snapshot_id=snap.snapshot_id)
    vol = csi_resources.create_volume(content_source=source)
    assert vol.content_source == source
