"""``kubevol csi node ...`` commands: every Node RPC."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from kubevol.cli.csi.common import (
    Command,
    Output,
    add_caps,
    add_map,
    add_range,
    caps_of,
    caps_output,
    done,
    map_of,
    plain_data,
    range_of,
    table,
)
from kubevol.cli.output import Column, Table, cell, human_bytes
from kubevol.csi import types as t
from kubevol.csidriver.sanity.inputs import Secrets

if TYPE_CHECKING:
    from kubevol.csi.client import CSIClient


def stage(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    client.node_stage_volume(
        args.volume_id,
        args.staging_target_path,
        caps_of(args)[0],
        publish_context=map_of(args.pub_context, "publish context"),
        secrets=secrets.for_rpc("NodeStageVolume"),
        volume_context=map_of(args.vol_context, "volume context"),
    )
    return done(volume_id=args.volume_id, staged=args.staging_target_path)


def _contexts(p: argparse.ArgumentParser) -> None:
    add_caps(p, single=True)
    add_map(p, "--vol-context", "volume context (repeatable)")
    add_map(p, "--pub-context", "publish context (repeatable)")


def _stage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("volume_id", metavar="VOLUME_ID")
    p.add_argument("--staging-target-path", required=True, help="where to stage")
    _contexts(p)


def unstage(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    client.node_unstage_volume(args.volume_id, args.staging_target_path)
    return done(volume_id=args.volume_id, unstaged=args.staging_target_path)


def _unstage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("volume_id", metavar="VOLUME_ID")
    p.add_argument("--staging-target-path", required=True)


def publish(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    client.node_publish_volume(
        args.volume_id,
        args.target_path,
        caps_of(args)[0],
        staging_target_path=args.staging_target_path,
        readonly=args.read_only,
        publish_context=map_of(args.pub_context, "publish context"),
        secrets=secrets.for_rpc("NodePublishVolume"),
        volume_context=map_of(args.vol_context, "volume context"),
    )
    return done(volume_id=args.volume_id, published=args.target_path)


def _publish_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("volume_id", metavar="VOLUME_ID")
    p.add_argument("--target-path", required=True, help="where to publish")
    p.add_argument("--staging-target-path", default="", help="where the volume is staged")
    p.add_argument("--read-only", action="store_true")
    _contexts(p)


def unpublish(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    client.node_unpublish_volume(args.volume_id, args.target_path)
    return done(volume_id=args.volume_id, unpublished=args.target_path)


def _unpublish_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("volume_id", metavar="VOLUME_ID")
    p.add_argument("--target-path", required=True)


def _volume_spec(text: str) -> tuple[str, str, str]:
    vid, sep, rest = text.partition(":")
    if not sep or not vid or not rest:
        raise argparse.ArgumentTypeError(f"{text!r} is not VOLUME_ID:PATH[:STAGING_PATH]")
    path, _, staging = rest.partition(":")
    return vid, path, staging


def _usage_figure(field: str) -> Column:
    """A figure of the usage entry a row shows: bytes for the BYTES unit, counts else."""

    def show(usage: object) -> str:
        if not isinstance(usage, Mapping):  # None: no usage entry
            return "-"
        value = usage.get(field)
        bytes_ = usage.get("unit") == t.UsageUnit.BYTES.name
        return human_bytes(value) if bytes_ else cell(value)

    return Column("usage", header=field.upper(), show=show)


#: One row per usage entry (BYTES, INODES) of each volume.
STATS = Table(
    columns=(
        Column("volume_id"),
        Column("volume_path"),
        Column("usage.unit", header="UNIT"),
        _usage_figure("total"),
        _usage_figure("used"),
        _usage_figure("available"),
        Column("volume_condition.abnormal", header="ABNORMAL"),
        Column("volume_condition.message", header="MESSAGE", wide=True),
    ),
    explode="usage",
)


def stats(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    data = []
    for vid, path, staging in args.volumes:
        result = client.node_get_volume_stats(vid, path, staging_target_path=staging)
        fields = attrs.asdict(result, recurse=False)
        data.append(plain_data({"volume_id": vid, "volume_path": path, **fields}))
    return Output(data=data, tables=(STATS,))


def _stats_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "volumes",
        nargs="+",
        type=_volume_spec,
        metavar="VOLUME_ID:PATH[:STAGING_PATH]",
        help="volume and the path it is published (or staged) at",
    )


def expand(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    size = client.node_expand_volume(
        args.volume_id,
        args.volume_path,
        capacity_range=range_of(args),
        staging_target_path=args.staging_target_path,
        capability=args.caps[0] if args.caps else None,
        secrets=secrets.for_rpc("NodeExpandVolume"),
    )
    return done(volume_id=args.volume_id, capacity_bytes=size)


def _expand_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("volume_id", metavar="VOLUME_ID")
    p.add_argument("volume_path", metavar="VOLUME_PATH")
    p.add_argument("--staging-target-path", default="")
    add_range(p)
    add_caps(p, single=True)


def get_info(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    info = plain_data(client.node_get_info())
    topology = Column("accessible_topology.segments", header="TOPOLOGY")
    return Output(data=info, tables=table("node_id", "max_volumes_per_node", topology))


def get_capabilities(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    return caps_output(client.node_get_capabilities())


NODE = (
    Command(name="stage", help="NodeStageVolume", handler=stage, add_args=_stage_args),
    Command(name="unstage", help="NodeUnstageVolume", handler=unstage, add_args=_unstage_args),
    Command(name="publish", help="NodePublishVolume", handler=publish, add_args=_publish_args),
    Command(
        name="unpublish", help="NodeUnpublishVolume", handler=unpublish, add_args=_unpublish_args
    ),
    Command(name="stats", help="NodeGetVolumeStats", handler=stats, add_args=_stats_args),
    Command(name="expand", help="NodeExpandVolume", handler=expand, add_args=_expand_args),
    Command(name="get-info", help="NodeGetInfo", handler=get_info),
    Command(name="get-capabilities", help="NodeGetCapabilities", handler=get_capabilities),
)
