"""``kubevol mount-refs``: explain whether a device mount path may be unmounted, and why."""

from __future__ import annotations

import argparse
import os
import sys

from kubevol.cli import exits
from kubevol.cli.output import Table, add_output_flags, columns, emit
from kubevol.cli.parser import DEFAULT_ROOT, ROOT_ENV, default_root
from kubevol.errors import MountError, MountInfoError
from kubevol.mount.guard import GuardPolicy, check_unmount_device
from kubevol.mount.mountread import PROC_MOUNTINFO, read_mountinfo_bytes
from kubevol.mount.table import MountTable

#: The references, one row each (the verdict itself is printed above them in tables).
REFS = Table(columns=columns("mount_point", "kind", "blocking", "reason"), at="refs")


def run(args: argparse.Namespace) -> int:
    """Check ``args.path``; print the verdict; exit 0 (allowed), 3 (blocked) or 64 (bad input)."""
    if not os.path.isdir(args.root):
        return _bad_input(f"--root {args.root!r} is not a directory")
    try:
        table = MountTable(read_mountinfo_bytes(args.mountinfo))
        table.entries()  # a malformed table is bad input, reported before any verdict
    except MountInfoError as exc:
        return _bad_input(f"--mountinfo {args.mountinfo!r}: {exc}")
    except MountError as exc:
        return _bad_input(str(exc))
    verdict = check_unmount_device(
        args.path,
        root_dir=args.root,
        policy=args.policy,
        detach_follows=args.detach_follows,
        table=table,
    )
    data: dict[str, object] = {
        **verdict.to_dict(), "message": verdict.message, "warnings": list(verdict.warnings)
    }
    if args.output.tabular and not args.no_headers:
        state = "allowed" if verdict.allowed else "BLOCKED"
        print(f"{verdict.path}: unmount {state} (policy {verdict.policy.value})")
        print(verdict.message)
        print("" if verdict.refs else "no other mount of this filesystem")
    if verdict.refs or not args.output.tabular:
        emit(data, REFS, args, sys.stdout)
    for warning in verdict.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return exits.OK if verdict.allowed else exits.BLOCKED


def _bad_input(message: str) -> int:
    print(f"kubevol mount-refs: {message}", file=sys.stderr)
    return exits.USAGE


def configure(parser: argparse.ArgumentParser) -> None:
    """Configure the ``mount-refs`` command."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "List every other mount of the filesystem mounted at PATH (a CSI staging or\n"
        "global mount), say whose each one is (same-volume, other-volume,\n"
        "kubelet-root-alias, foreign) and whether it blocks the unmount.\n\n"
        "Policies:\n"
        "  kubelet  exactly what the kubelet checks before NodeUnstageVolume: mounts\n"
        "           with the same root and major:minor, ignoring only paths that\n"
        "           contain PATH's /plugins/kubernetes.io/... part. Two volumes staged\n"
        "           from one Lustre/CephFS/NFS filesystem block each other here.\n"
        "  safe     (default) also counts binds of sub-directories; attributes kubelet\n"
        "           mounts to volumes by their layout and vol_data.json; lets other\n"
        "           volumes' mounts pass unless a detach follows; warns about, rather\n"
        "           than blocks on, foreign users of a network filesystem.\n\n"
        "Exit status: 0 the unmount is allowed, 3 it is blocked, 64 bad input."
    )
    parser.epilog = (
        "examples:\n"
        "  kubevol mount-refs "
        "/var/lib/kubelet/plugins/kubernetes.io/csi/DRIVER/HASH/globalmount\n"
        "  kubevol mount-refs PATH --policy kubelet -o json\n"
        "  kubevol mount-refs PATH --mountinfo saved-mountinfo.txt --detach-follows"
    )
    parser.add_argument("path", metavar="PATH", help="the device mount path to check")
    parser.add_argument(
        "--root",
        default=default_root(),
        metavar="DIR",
        help="the kubelet root directory whose layout is read "
        f"(default: ${ROOT_ENV}, else {DEFAULT_ROOT})",
    )
    parser.add_argument(
        "--policy",
        choices=[p.value for p in GuardPolicy],
        default=GuardPolicy.SAFE.value,
        help="which rules decide (default: safe)",
    )
    parser.add_argument(
        "--detach-follows",
        action="store_true",
        help="the device is detached from the node after the unmount (block on every user)",
    )
    parser.add_argument(
        "--mountinfo",
        default=PROC_MOUNTINFO,
        metavar="FILE",
        help=(
            f"read the mount table from FILE (default: {PROC_MOUNTINFO}); PATH and the "
            "kubelet layout are still read from this node"
        ),
    )
    add_output_flags(parser)
    parser.set_defaults(func=run)
