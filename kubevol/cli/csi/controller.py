"""``kubevol csi controller ...`` commands: every Controller RPC."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kubevol.cli.csi.common import (
    SNAPSHOT_COLUMNS,
    Command,
    Output,
    add_caps,
    add_map,
    add_paging,
    add_range,
    caps_of,
    caps_output,
    done,
    map_of,
    pages,
    plain_data,
    range_of,
    table,
    volume_columns,
)
from kubevol.cli.output import Column
from kubevol.csi import types as t
from kubevol.csidriver.sanity.inputs import Secrets

if TYPE_CHECKING:
    from kubevol.csi.client import CSIClient


def _volumes_output(vols: list[t.Volume]) -> Output:
    return Output(data=plain_data(vols), tables=table(*volume_columns()))


#: A ListVolumes / ControllerGetVolume entry: the volume, then its status.
ENTRY_COLUMNS = (
    *volume_columns("volume."),
    Column("status.published_node_ids", header="NODES"),
    Column("status.volume_condition.abnormal", header="ABNORMAL"),
    Column("status.volume_condition.message", header="MESSAGE", wide=True),
)


def create_volume(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    source: t.ContentSource | None = None
    if args.source_snapshot:
        source = t.SnapshotSource(snapshot_id=args.source_snapshot)
    elif args.source_volume:
        source = t.VolumeSource(volume_id=args.source_volume)
    params = map_of(args.params, "parameter")
    mutable = map_of(args.mutable_params, "mutable parameter")
    vols = [
        client.create_volume(
            name,
            caps_of(args),
            capacity_range=range_of(args),
            parameters=params,
            mutable_parameters=mutable,
            secrets=secrets.for_rpc("CreateVolume"),
            content_source=source,
        )
        for name in args.names
    ]
    return _volumes_output(vols)


def _create_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="+", metavar="NAME", help="volume name(s)")
    add_caps(p)
    add_range(p)
    add_map(p, "--params", "parameters (repeatable)")
    add_map(p, "--mutable-params", "mutable parameters (repeatable)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--source-snapshot", "--snapshot-src", metavar="SNAPSHOT_ID", help="create from a snapshot"
    )
    src.add_argument("--source-volume", "--volume-src", metavar="VOLUME_ID", help="clone a volume")


def delete_volume(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    for vid in args.volume_ids:
        client.delete_volume(vid, secrets=secrets.for_rpc("DeleteVolume"))
    rows = [{"volume_id": v, "deleted": True} for v in args.volume_ids]
    return Output(data=rows, tables=table("volume_id", "deleted"))


def _ids(p: argparse.ArgumentParser) -> None:
    p.add_argument("volume_ids", nargs="+", metavar="VOLUME_ID")


def _one_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("volume_id", metavar="VOLUME_ID")


def publish(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    rows: list[dict[str, object]] = []
    for vid in args.volume_ids:
        ctx = client.controller_publish_volume(
            vid,
            args.node_id,
            caps_of(args)[0],
            readonly=args.read_only,
            secrets=secrets.for_rpc("ControllerPublishVolume"),
            volume_context=map_of(args.vol_context, "volume context"),
        )
        rows.append({"volume_id": vid, "publish_context": ctx})
    return Output(data=rows, tables=table("volume_id", "publish_context"))


def _publish_args(p: argparse.ArgumentParser) -> None:
    _ids(p)
    p.add_argument("--node-id", required=True, help="the node to attach to")
    add_caps(p, single=True)
    p.add_argument("--read-only", action="store_true", help="attach read-only")
    add_map(p, "--vol-context", "volume context (repeatable)")


def unpublish(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    for vid in args.volume_ids:
        client.controller_unpublish_volume(
            vid, args.node_id, secrets=secrets.for_rpc("ControllerUnpublishVolume")
        )
    rows = [{"volume_id": v, "unpublished": True} for v in args.volume_ids]
    return Output(data=rows, tables=table("volume_id", "unpublished"))


def _unpublish_args(p: argparse.ArgumentParser) -> None:
    _ids(p)
    p.add_argument("--node-id", default="", help="the node (default: every node)")


def validate(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    result = client.validate_volume_capabilities(
        args.volume_id,
        caps_of(args),
        volume_context=map_of(args.vol_context, "volume context"),
        parameters=map_of(args.params, "parameter"),
        secrets=secrets.for_rpc("ValidateVolumeCapabilities"),
    )
    confirmed = Column("confirmed", show=lambda c: "false" if c is None else "true")
    return Output(data=plain_data(result), tables=table(confirmed, "message"))


def _validate_args(p: argparse.ArgumentParser) -> None:
    _one_id(p)
    add_caps(p)
    add_map(p, "--vol-context", "volume context (repeatable)")
    add_map(p, "--params", "parameters (repeatable)")


def list_volumes(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    entries = list(
        pages(
            lambda token: client.list_volumes(max_entries=args.max_entries, starting_token=token),
            args,
        )
    )
    return Output(data=plain_data(entries), tables=table(*ENTRY_COLUMNS, name="volume.volume_id"))


def get_capacity(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    cap = client.get_capacity(
        capabilities=args.caps or (), parameters=map_of(args.params, "parameter")
    )
    sizes = ("available_capacity", "maximum_volume_size", "minimum_volume_size")
    return Output(data=plain_data(cap), tables=table(*(Column(k, size=True) for k in sizes)))


def _capacity_args(p: argparse.ArgumentParser) -> None:
    add_caps(p)
    add_map(p, "--params", "parameters (repeatable)")


def get_capabilities(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    return caps_output(client.controller_get_capabilities())


def _snapshots_output(snaps: list[t.Snapshot]) -> Output:
    return Output(data=plain_data(snaps), tables=table(*SNAPSHOT_COLUMNS))


def create_snapshot(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    snaps = [
        client.create_snapshot(
            args.source_volume,
            name,
            secrets=secrets.for_rpc("CreateSnapshot"),
            parameters=map_of(args.params, "parameter"),
        )
        for name in args.names
    ]
    return _snapshots_output(snaps)


def _create_snapshot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="+", metavar="NAME", help="snapshot name(s)")
    p.add_argument("--source-volume", "--volume-src", required=True, metavar="VOLUME_ID")
    add_map(p, "--params", "parameters (repeatable)")


def delete_snapshot(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    for sid in args.snapshot_ids:
        client.delete_snapshot(sid, secrets=secrets.for_rpc("DeleteSnapshot"))
    rows = [{"snapshot_id": s, "deleted": True} for s in args.snapshot_ids]
    return Output(data=rows, tables=table("snapshot_id", "deleted"))


def _snapshot_ids(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot_ids", nargs="+", metavar="SNAPSHOT_ID")


def list_snapshots(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    snaps = list(
        pages(
            lambda token: client.list_snapshots(
                max_entries=args.max_entries,
                starting_token=token,
                source_volume_id=args.source_volume_id,
                snapshot_id=args.snapshot_id,
                secrets=secrets.for_rpc("ListSnapshots"),
            ),
            args,
        )
    )
    return _snapshots_output(snaps)


def _list_snapshots_args(p: argparse.ArgumentParser) -> None:
    add_paging(p)
    p.add_argument("--source-volume-id", default="", help="only snapshots of this volume")
    p.add_argument("--snapshot-id", default="", help="only this snapshot")


def get_snapshot(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    snap = client.get_snapshot(args.snapshot_id, secrets=secrets.for_rpc("GetSnapshot"))
    return _snapshots_output([snap])


def _one_snapshot(p: argparse.ArgumentParser) -> None:
    p.add_argument("snapshot_id", metavar="SNAPSHOT_ID")


def expand_volume(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    rng = range_of(args)
    if rng is None:
        raise ValueError("expand-volume needs --req-bytes or --lim-bytes")
    result = client.controller_expand_volume(
        args.volume_id,
        rng,
        capability=args.caps[0] if args.caps else None,
        secrets=secrets.for_rpc("ControllerExpandVolume"),
    )
    return done(
        volume_id=args.volume_id,
        capacity_bytes=result.capacity_bytes,
        node_expansion_required=result.node_expansion_required,
    )


def _expand_args(p: argparse.ArgumentParser) -> None:
    _one_id(p)
    add_range(p)
    add_caps(p, single=True)


def get_volume(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    entry = client.controller_get_volume(args.volume_id)
    return Output(data=plain_data(entry), tables=table(*ENTRY_COLUMNS, name="volume.volume_id"))


def modify_volume(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    mutable = map_of(args.mutable_params, "mutable parameter")
    client.controller_modify_volume(
        args.volume_id, mutable, secrets=secrets.for_rpc("ControllerModifyVolume")
    )
    return done(volume_id=args.volume_id, modified=True)


def _modify_args(p: argparse.ArgumentParser) -> None:
    _one_id(p)
    add_map(p, "--mutable-params", "mutable parameters to set (repeatable)")


CONTROLLER = (
    Command(
        name="create-volume",
        help="CreateVolume",
        handler=create_volume,
        add_args=_create_args,
        aliases=("n", "c", "new", "create"),
    ),
    Command(
        name="delete-volume",
        help="DeleteVolume",
        handler=delete_volume,
        add_args=_ids,
        aliases=("d", "rm", "del", "delete"),
    ),
    Command(
        name="publish", help="ControllerPublishVolume", handler=publish, add_args=_publish_args
    ),
    Command(
        name="unpublish",
        help="ControllerUnpublishVolume",
        handler=unpublish,
        add_args=_unpublish_args,
    ),
    Command(
        name="validate-volume-capabilities",
        help="ValidateVolumeCapabilities",
        handler=validate,
        add_args=_validate_args,
    ),
    Command(
        name="list-volumes",
        help="ListVolumes",
        handler=list_volumes,
        add_args=add_paging,
        aliases=("l", "ls", "list"),
    ),
    Command(name="get-capacity", help="GetCapacity", handler=get_capacity, add_args=_capacity_args),
    Command(name="get-capabilities", help="ControllerGetCapabilities", handler=get_capabilities),
    Command(
        name="create-snapshot",
        help="CreateSnapshot",
        handler=create_snapshot,
        add_args=_create_snapshot_args,
    ),
    Command(
        name="delete-snapshot",
        help="DeleteSnapshot",
        handler=delete_snapshot,
        add_args=_snapshot_ids,
    ),
    Command(
        name="list-snapshots",
        help="ListSnapshots",
        handler=list_snapshots,
        add_args=_list_snapshots_args,
    ),
    Command(name="get-snapshot", help="GetSnapshot", handler=get_snapshot, add_args=_one_snapshot),
    Command(
        name="expand-volume",
        help="ControllerExpandVolume",
        handler=expand_volume,
        add_args=_expand_args,
    ),
    Command(name="get-volume", help="ControllerGetVolume", handler=get_volume, add_args=_one_id),
    Command(
        name="modify-volume",
        help="ControllerModifyVolume",
        handler=modify_volume,
        add_args=_modify_args,
    ),
)
