"""``kubevol reconstruct``: what the disk says is mounted, read-only unless ``--repair``."""

from __future__ import annotations

import argparse
import sys

from kubevol.cli.node_common import add_root_flags, open_runtime, report_sync
from kubevol.cli.output import add_output_flag, render, write_table
from kubevol.cli.parser import DURATION
from kubevol.node.privileges import require_privileges
from kubevol.node.reconstruct import Reconstruction, scan


def run(args: argparse.Namespace) -> int:
    if args.repair:
        require_privileges("kubevol reconstruct --repair")
    with open_runtime(args) as runtime:
        if not args.repair:
            result = scan(runtime.host, runtime.mgr)
            show(result, args.output)
            return 0
        pods = runtime.volume_manager()
        try:
            result = pods.reconstruct(clean=True, repair_all=True)
            sync = pods.sync(timeout=args.timeout)
        finally:
            pods.close()
        show(result, args.output)
        report_sync(sync)
        outcomes = [f.cleanup for f in result.failures] + [o.cleanup for o in result.orphans]
        failed = any(c.startswith("failed") for c in outcomes)
        return 0 if sync.converged and not failed else 1


def show(result: Reconstruction, fmt: str) -> None:
    data = result.to_dict()
    if fmt != "table":
        render(data, fmt, sys.stdout)
        return
    out = sys.stdout
    write_table(
        data["volumes"],
        ("pod_uid", "plugin", "volume", "mode", "mount", "device", "path"),
        out,
    )
    if data["failures"]:
        out.write("\nvolumes that could not be reconstructed:\n")
        write_table(data["failures"], ("pod_uid", "plugin", "volume", "cleanup", "reason"), out)
    if data["orphan_device_mounts"]:
        out.write("\ndevice mounts no pod volume leads to:\n")
        write_table(data["orphan_device_mounts"], ("path", "plugin", "source", "cleanup"), out)


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
    add_output_flag(parser, ("table", "json", "yaml"))
    parser.set_defaults(func=run)
