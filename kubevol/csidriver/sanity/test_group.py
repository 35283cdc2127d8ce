"""GroupController service: volume group snapshots."""

from __future__ import annotations

from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.sanity.checks import Code, expect_code, need_controller, need_group
from kubevol.csidriver.sanity.context import Resources, SanityContext, repeat, unique_name


def test_group_capabilities_are_known(csi_sanity: SanityContext) -> None:
    """GroupControllerGetCapabilities answers only values the spec defines."""
    need_group(csi_sanity)
    caps = csi_sanity.controller.group_controller_get_capabilities()
    assert t.GroupControllerCapability.UNKNOWN not in caps


def test_group_snapshot_lifecycle(csi_sanity: SanityContext, csi_resources: Resources) -> None:
    """A group snapshot of two volumes: required fields, idempotent creation with one
    member per volume, get, NOT_FOUND when unknown, delete (OK again)."""
    need_group(csi_sanity)
    need_controller(csi_sanity, t.ControllerCapability.CREATE_DELETE_VOLUME)
    c = csi_sanity.controller
    expect_code(
        Code.INVALID_ARGUMENT,
        lambda: c.call("CreateVolumeGroupSnapshot", csi_pb2.CreateVolumeGroupSnapshotRequest()),
    )
    vids = [csi_resources.create_volume().volume_id for _ in range(2)]
    name = unique_name("group")
    secrets = csi_sanity.secrets("CreateVolumeGroupSnapshot")
    group = repeat(
        csi_sanity.config.idempotent_count,
        lambda: c.create_volume_group_snapshot(name, vids, secrets=secrets),
    )
    members = tuple(s.snapshot_id for s in group.snapshots)
    csi_resources.groups.append((group.group_snapshot_id, members))
    assert sorted(s.source_volume_id for s in group.snapshots) == sorted(vids)
    got = c.get_volume_group_snapshot(
        group.group_snapshot_id, members, secrets=csi_sanity.secrets("GetVolumeGroupSnapshot")
    )
    assert got.group_snapshot_id == group.group_snapshot_id
    expect_code(Code.NOT_FOUND, lambda: c.get_volume_group_snapshot(unique_name("none"), []))
    delete_secrets = csi_sanity.secrets("DeleteVolumeGroupSnapshot")
    repeat(
        csi_sanity.config.idempotent_count,
        lambda: c.delete_volume_group_snapshot(
            group.group_snapshot_id, members, secrets=delete_secrets
        ),
    )


def test_group_snapshot_required_fields_and_unknown_ids(csi_sanity: SanityContext) -> None:
    """Get and Delete without a group snapshot id are INVALID_ARGUMENT; Get of an unknown
    id is NOT_FOUND, Delete of one OK."""
    need_group(csi_sanity)
    c = csi_sanity.controller
    expect_code(
        Code.INVALID_ARGUMENT,
        lambda: c.call("GetVolumeGroupSnapshot", csi_pb2.GetVolumeGroupSnapshotRequest()),
    )
    expect_code(
        Code.INVALID_ARGUMENT,
        lambda: c.call("DeleteVolumeGroupSnapshot", csi_pb2.DeleteVolumeGroupSnapshotRequest()),
    )
    unknown = unique_name("no-group")
    expect_code(Code.NOT_FOUND, lambda: c.get_volume_group_snapshot(unknown, []))
    c.delete_volume_group_snapshot(
        unknown, [], secrets=csi_sanity.secrets("DeleteVolumeGroupSnapshot")
    )
