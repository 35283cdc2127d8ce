"""``kubevol csi group ...`` commands: the GroupController RPCs (volume group snapshots)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kubevol.cli.csi.common import (
    SNAPSHOT_COLUMNS,
    Command,
    Output,
    add_map,
    caps_output,
    done,
    map_of,
    plain_data,
    table,
)
from kubevol.cli.output import Column, Table
from kubevol.csi import types as t
from kubevol.csidriver.sanity.inputs import Secrets

if TYPE_CHECKING:
    from kubevol.csi.client import CSIClient


def group_capabilities(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    return caps_output(client.group_controller_get_capabilities())


def _group_output(group: t.VolumeGroupSnapshot) -> Output:
    """The group, one row per member snapshot (each names its group); ``-o name`` prints
    the group's id once."""
    columns = (Column("group_snapshot_id"), *SNAPSHOT_COLUMNS)
    return Output(
        data=plain_data(group),
        tables=(Table(columns=columns, at="snapshots"),),
        names=table("group_snapshot_id"),
    )


def create_group(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    group = client.create_volume_group_snapshot(
        args.name,
        args.source_volumes,
        secrets=secrets.for_rpc("CreateVolumeGroupSnapshot"),
        parameters=map_of(args.params, "parameter"),
    )
    return _group_output(group)


def delete_group(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    client.delete_volume_group_snapshot(
        args.group_snapshot_id,
        args.snapshot_ids,
        secrets=secrets.for_rpc("DeleteVolumeGroupSnapshot"),
    )
    return done(group_snapshot_id=args.group_snapshot_id, deleted=True)


def get_group(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    group = client.get_volume_group_snapshot(
        args.group_snapshot_id,
        args.snapshot_ids,
        secrets=secrets.for_rpc("GetVolumeGroupSnapshot"),
    )
    return _group_output(group)


def _create_group_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="group snapshot name")
    p.add_argument(
        "--source-volume",
        dest="source_volumes",
        action="append",
        required=True,
        metavar="VOLUME_ID",
        help="a volume to include (repeatable)",
    )
    add_map(p, "--params", "parameters (repeatable)")


def _group_id_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("group_snapshot_id", metavar="GROUP_SNAPSHOT_ID")
    p.add_argument(
        "--snapshot-id",
        dest="snapshot_ids",
        action="append",
        required=True,
        metavar="SNAPSHOT_ID",
        help="a member snapshot (required, as the CSI spec requires the list; repeatable)",
    )


GROUP = (
    Command(
        name="get-capabilities",
        help="GroupControllerGetCapabilities",
        handler=group_capabilities,
    ),
    Command(
        name="create-snapshot",
        help="CreateVolumeGroupSnapshot of several volumes",
        handler=create_group,
        add_args=_create_group_args,
    ),
    Command(
        name="delete-snapshot",
        help="DeleteVolumeGroupSnapshot",
        handler=delete_group,
        add_args=_group_id_args,
    ),
    Command(
        name="get-snapshot",
        help="GetVolumeGroupSnapshot",
        handler=get_group,
        add_args=_group_id_args,
    ),
)
