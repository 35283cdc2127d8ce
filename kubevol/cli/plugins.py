"""``kubevol plugins``: list the volume plugins kubevol knows and what each can do."""

from __future__ import annotations

import argparse
import sys

from kubevol import plugin as bases
from kubevol.cli.output import Column, Table, add_output_flags, columns, emit
from kubevol.manager import entry_point_plugins
from kubevol.node.host import node_plugins

#: Capability name → the base a plugin subclasses to offer it.
CAPABILITIES: dict[str, type[bases.VolumePlugin]] = {
    "persistent": bases.PersistentVolumePlugin,
    "recyclable": bases.RecyclableVolumePlugin,
    "deletable": bases.DeletableVolumePlugin,
    "provisionable": bases.ProvisionableVolumePlugin,
    "device-mountable": bases.DeviceMountableVolumePlugin,
    "attachable": bases.AttachableVolumePlugin,
    "expandable": bases.ExpandableVolumePlugin,
    "node-expandable": bases.NodeExpandableVolumePlugin,
    "block": bases.BlockVolumePlugin,
    "attach-limits": bases.VolumePluginWithAttachLimits,
    "bulk-verify": bases.BulkVolumeVerifier,
}


def describe(plugin: bases.VolumePlugin, source: str) -> dict[str, object]:
    """One plugin as a plain dict: name, source, capabilities and options."""
    return {
        "name": plugin.get_plugin_name(),
        "source": source,
        "capabilities": [name for name, base in CAPABILITIES.items() if isinstance(plugin, base)],
        "supports_mount_option": plugin.supports_mount_option(),
        "supports_bulk_volume_verification": plugin.supports_bulk_volume_verification(),
    }


TABLE = Table(
    columns=columns(
        "name",
        "source",
        "capabilities",
        Column("supports_mount_option", header="MOUNT OPTIONS", wide=True),
        Column("supports_bulk_volume_verification", header="BULK VERIFY", wide=True),
    )
)


def run(args: argparse.Namespace) -> int:
    rows = [describe(p, "builtin") for p in node_plugins()]
    found, problems = entry_point_plugins()
    rows += [describe(p, "entry-point") for p in found]
    rows.sort(key=lambda r: (r["source"] != "builtin", r["name"]))
    emit(rows, TABLE, args, sys.stdout)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List the volume plugins kubevol ships and those installed through the "
        "'kubevol.plugins' entry-point group, with the capabilities each offers."
    )
    add_output_flags(parser)
    parser.set_defaults(func=run)
