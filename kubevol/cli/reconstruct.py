"""``kubevol reconstruct``: what the disk says is mounted, read-only unless ``--repair``."""

from __future__ import annotations

import argparse
import sys

from kubevol.cli.node_common import add_root_flags, open_runtime, report_sync
from kubevol.cli.output import Column, Table, add_output_flags, columns, emit
from kubevol.cli.parser import DURATION
from kubevol.deadline import Deadline
from kubevol.node.cleanup import CleanupKind
from kubevol.node.privileges import require_privileges
from kubevol.node.reconstruct import Reconstruction, scan


def run(args: argparse.Namespace) -> int:
    deadline = Deadline.after(args.timeout)
    if args.repair:
        require_privileges("kubevol reconstruct --repair")
    with open_runtime(args, deadline=deadline, exclusive=args.repair) as runtime:
        if not args.repair:
            result = scan(runtime.host, runtime.mgr)
            show(result, args)
            return 0
        pods = runtime.volume_manager()
        try:
            result = pods.reconstruct(clean=True, repair_all=True)
            sync = pods.sync(timeout=args.timeout)
        finally:
            pods.close()
        show(result, args)
        report_sync(sync)
        outcomes = [f.cleanup for f in result.failures] + [o.cleanup for o in result.orphans]
        failed = any(c.kind is CleanupKind.FAILED for c in outcomes)
        return 0 if sync.converged and not failed else 1


#: The reconstruction's three lists, each a table (the last two only when not empty).
TABLES = (
    Table(
        columns=columns(
            "pod_uid", "plugin", "volume", "mode", "mount", "device", "path",
            Column("unique_name", wide=True), Column("device_mount_path", wide=True),
        ),
        at="volumes",
        name="path",
    ),
    Table(
        columns=columns("pod_uid", "plugin", "volume", "cleanup", "reason",
                        Column("path", wide=True)),
        at="failures",
        title="volumes that could not be reconstructed",
        name="path",
    ),
    Table(
        columns=columns("path", "plugin", "source", "cleanup", Column("kind", wide=True),
                        Column("fs_type", wide=True)),
        at="orphan_device_mounts",
        title="device mounts no pod volume leads to",
    ),
)


def show(result: Reconstruction, args: argparse.Namespace) -> None:
    emit(result.to_dict(), TABLES, args, sys.stdout)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Walk pods/<uid>/volumes and volumeDevices under --root, rebuild each volume "
        "with its plugin, check its mount, and report volumes that cannot be rebuilt and "
        "device mounts no pod leads to. Changes nothing unless --repair: then volumes "
        "that cannot be rebuilt are cleaned once (their pods not being run by kubevol), "
        "orphan device mounts are unmounted through the unstage guard, and pods kubevol "
        "runs are brought up to date."
    )
    add_root_flags(parser)
    parser.add_argument("--repair", action="store_true", help="clean what is broken")
    parser.add_argument("--timeout", type=DURATION, default=120.0,
                        help="with --repair: how long to keep retrying, a Go duration or seconds "
                        "(default: 2m)")
    add_output_flags(parser)
    parser.set_defaults(func=run)
