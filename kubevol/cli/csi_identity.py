"""``kubevol csi identity ...`` and ``kubevol csi group ...`` commands."""

from __future__ import annotations

import argparse

from kubevol.cli.csi_commands import (
    SNAPSHOT_COLUMNS,
    Command,
    Output,
    add_map,
    caps_output,
    done,
    map_of,
    plain,
    snapshot_row,
)
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.sanity.inputs import Secrets


def plugin_info(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    info = client.get_plugin_info()
    row = {"name": info.name, "vendor_version": info.vendor_version, "manifest": info.manifest}
    return Output(data=plain(info), rows=[row], columns=("name", "vendor_version", "manifest"))


def plugin_capabilities(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    caps = client.get_plugin_capabilities()
    rows = [{"type": "service", "capability": c.name} for c in sorted(caps.services)]
    rows += [
        {"type": "volume_expansion", "capability": c.name} for c in sorted(caps.volume_expansion)
    ]
    data = {
        "services": [c.name for c in sorted(caps.services)],
        "volume_expansion": [c.name for c in sorted(caps.volume_expansion)],
    }
    return Output(data=data, rows=rows, columns=("type", "capability"))


def probe(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    return done(ready=client.probe())


IDENTITY = (
    Command(name="plugin-info", help="GetPluginInfo: name, version, manifest", handler=plugin_info),
    Command(
        name="plugin-capabilities",
        help="GetPluginCapabilities: services and expansion modes",
        handler=plugin_capabilities,
    ),
    Command(name="probe", help="Probe: is the driver ready", handler=probe),
)


def group_capabilities(client: CSIClient, args: argparse.Namespace, secrets: Secrets) -> Output:
    return caps_output(client.group_controller_get_capabilities())


def _group_output(group: t.VolumeGroupSnapshot) -> Output:
    rows = [
        {"group_snapshot_id": group.group_snapshot_id, **snapshot_row(s)} for s in group.snapshots
    ]
    return Output(data=plain(group), rows=rows, columns=("group_snapshot_id", *SNAPSHOT_COLUMNS))


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
        default=[],
        metavar="SNAPSHOT_ID",
        help="a member snapshot (repeatable)",
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
