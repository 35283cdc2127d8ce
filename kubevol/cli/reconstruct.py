"""``kubevol reconstruct``: what the disk says is mounted, read-only unless ``--repair``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kubevol.cli import exits
from kubevol.cli.exits import UsageError
from kubevol.cli.node_common import (
    VOLUME_STATES,
    add_root_flags,
    not_done,
    open_runtime,
    report_sync,
    require_root,
    root_lock,
    state_of,
)
from kubevol.cli.output import (
    Column,
    OutputFormat,
    Table,
    add_output_flags,
    columns,
    emit,
    render,
)
from kubevol.cli.parser import DURATION
from kubevol.layout import validate_path_segment
from kubevol.node.cleanup import CleanupKind
from kubevol.node.mountcheck import MountCheck
from kubevol.node.plan import RepairPlan, plan_repair
from kubevol.node.privileges import require_privileges
from kubevol.node.reconstruct import Reconstruction, scan
from kubevol.util.deadline import Deadline

if TYPE_CHECKING:
    from kubevol.node.runtime import NodeRuntime, RecordedPods


def run(args: argparse.Namespace) -> int:
    deadline = Deadline.after(args.timeout)
    if (args.pod_gone or args.pods_gone_file or args.dry_run) and not args.repair:
        raise UsageError("--pod-gone, --pods-gone-file and --dry-run go with --repair")
    require_root(args)
    gone = gone_pods(args)
    if args.repair and not args.dry_run:
        require_privileges("kubevol reconstruct --repair")
    # The root is locked only once the repair has something to do (below); --csi-driver
    # may write the root's driver list as the runtime opens, so it locks up front.
    early_lock = args.repair and not args.dry_run and bool(args.csi_driver)
    with open_runtime(args, deadline=deadline, exclusive=early_lock) as runtime:
        if not args.repair:
            result = scan(runtime.host, runtime.mgr)
            show(result, args)
            return exits.report_unresponsive(
                (f"pod {v.dir.pod_uid} volume {v.dir.spec_name} at {v.mount_path}",
                 f"did not answer within {runtime.host.probe.timeout:g}s (left as it is)")
                for v in result.volumes if MountCheck.UNRESPONSIVE in (v.mount, v.device)
            )
        # The plan is made from the same scan, ownership and desired state the repair
        # then uses: it does these actions and no others.
        pods, found, plan = survey(runtime, gone)
        try:
            if args.dry_run:
                warn_uninspected(plan)
                emit(plan.to_dict(), PLAN_TABLES, args, sys.stdout)
                return 0
            if not early_lock:
                if not plan.actions and not has_records(pods):
                    # Nothing kubevol's and nothing to do: not even the lock is written.
                    warn_uninspected(plan)
                    render(plan.to_dict(), PLAN_TABLES, OutputFormat("table"), sys.stderr)
                    show(pods.manager.left_alone(found), args, plan)
                    return 0
                # Planned unlocked: plan again under the lock, so that what is done is
                # what a writer that finished meanwhile left.
                pods.close()
                runtime.hold(root_lock(args, deadline))
                pods, found, plan = survey(runtime, gone)
            warn_uninspected(plan)
            render(plan.to_dict(), PLAN_TABLES, OutputFormat("table"), sys.stderr)
            result = pods.manager.clean(found)
            sync = pods.sync(timeout=args.timeout)
        finally:
            pods.close()
        outcomes = [f.cleanup for f in result.failures] + [o.cleanup for o in result.orphans]
        outcomes += [o.cleanup for o in result.orphan_subpaths]
        cleanups = [str(c) for c in outcomes if c.kind is CleanupKind.FAILED]
        left = not_done(sync)
        if cleanups:
            left = left or {"reason": "clean-ups failed", "pending": [], "failures": []}
            left["cleanups"] = cleanups
        show(result, args, plan, left)
        report_sync(sync)
        for cleanup in cleanups:
            print(f"  clean-up failed: {cleanup}", file=sys.stderr)
        # Exit 1 when anything planned or asked was not done, as up and down do.
        return 0 if left is None else 1


def survey(
    runtime: NodeRuntime, gone: list[str]
) -> tuple[RecordedPods, Reconstruction, RepairPlan]:
    """A volume manager for the repair, its scan of the root (nothing cleaned yet) and the
    plan of the repair; reads only. The caller closes the manager."""
    pods = runtime.volume_manager(gone=gone)
    try:
        found = pods.reconstruct(clean=False)
        return pods, found, plan_repair(found, pods.manager)
    except BaseException:
        pods.close()
        raise


def warn_uninspected(plan: RepairPlan) -> None:
    """Say when the plan could not read some processes' open files (it may miss refusals)."""
    if plan.uninspected:
        print(f"warning: the open files of {plan.uninspected} processes could not be "
              "read (run as root): the plan may miss refusals", file=sys.stderr)


def has_records(pods: RecordedPods) -> bool:
    """Whether the root has pod records (readable or not): pods kubevol runs, which a
    repair brings up to date even when it plans nothing destructive."""
    return bool(pods.records) or bool(pods.invalid)


#: The largest --pods-gone-file read (a UID a line: room for a million pods).
MAX_GONE_FILE = 64 << 20


def gone_pods(args: argparse.Namespace) -> list[str]:
    """The UIDs of ``--pod-gone`` and ``--pods-gone-file`` (one a line; blank lines and
    ``#`` comments skipped), each validated as a path segment."""
    uids = list(args.pod_gone)
    for path in args.pods_gone_file:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_GONE_FILE + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--pods-gone-file {path}: {exc}") from exc
        if len(text) > MAX_GONE_FILE:
            raise UsageError(f"--pods-gone-file {path}: larger than {MAX_GONE_FILE} bytes")
        for line in text.splitlines():
            uid = line.split("#", 1)[0].strip()
            if uid:
                uids.append(uid)
    try:
        return [validate_path_segment(u, "pod UID") for u in uids]
    except ValueError as exc:
        raise UsageError(f"--pod-gone: {exc}") from exc


#: The reconstruction's lists, each a table (all but the first only when not empty).
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
        columns=columns("pod_uid", "plugin", "volume", "reason", Column("path", wide=True)),
        at="unknown_plugins",
        title="volumes of plugins kubevol does not have (left alone)",
        name="path",
    ),
    Table(
        columns=columns("path", "plugin", "source", "cleanup", Column("kind", wide=True),
                        Column("fs_type", wide=True)),
        at="orphan_device_mounts",
        title="device mounts no pod volume leads to",
    ),
    Table(
        columns=columns("pod_uid", "volume", "path", "mounted", "cleanup",
                        Column("reason", wide=True)),
        at="orphan_subpaths",
        title="subPath binds whose volume directory is gone",
        name="path",
    ),
)


def show(result: Reconstruction, args: argparse.Namespace,
         plan: RepairPlan | None = None, left: dict[str, object] | None = None) -> None:
    """The reconstruction (with a repair's plan and what it left not done, under
    ``not_done``); each volume's MOUNT in the words of :data:`VOLUME_STATES`."""
    data = result.to_dict()
    for row, found in zip(data["volumes"], result.volumes, strict=True):
        row["mount"] = state_of(found)
    if plan is not None:
        data["plan"] = plan.to_dict()
        data["not_done"] = left
    emit(data, TABLES, args, sys.stdout)


#: A repair's plan: its actions, then what it leaves alone.
PLAN_TABLES = (
    Table(
        columns=columns("action", "pod_uid", "plugin", "volume", "path", "reason", "refused"),
        at="actions",
        name="path",
    ),
    Table(
        columns=columns("pod_uid", "plugin", "volume", "path", "reason"),
        at="left",
        title="left alone",
        name="path",
    ),
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Walk pods/<uid>/volumes and volumeDevices under --root, rebuild each volume "
        "with its plugin, check its mount (MOUNT: the state words of up and status: "
        f"{', '.join(VOLUME_STATES)}), and report volumes that cannot be rebuilt and "
        "device mounts no pod leads to. Changes nothing unless --repair, and even then "
        "only what is kubevol's: pods it runs (its pod records) are brought up to date; "
        "pods named gone (--pod-gone, --pods-gone-file) are torn down, their volumes that "
        "cannot be rebuilt cleaned once; orphan device mounts of its plugins and drivers "
        "are unmounted through the unstage guard when every pod on the root is kubevol's. "
        "Everything else (other agents' pods, unknown plugins) is reported and left alone. "
        "The repair's plan is printed first (--dry-run: only the plan); a repair with "
        "nothing to do (no action planned, no pod records) does not even lock the root, "
        "so it writes nothing; one with actions locks the root and plans again under the "
        "lock before acting."
    )
    add_root_flags(parser)
    parser.add_argument("--repair", action="store_true", help="clean what is broken")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --repair: print the plan (every unmount, directory "
                        "removal, unstage and detach, with the reason it is allowed, and "
                        "what is left alone) and change nothing")
    parser.add_argument("--pod-gone", action="append", default=[], metavar="UID",
                        help="with --repair: a pod no agent runs any more, whose volumes "
                        "may be torn down (repeatable)")
    parser.add_argument("--pods-gone-file", action="append", default=[], metavar="FILE",
                        help="with --repair: a file of such pod UIDs, one a line")
    parser.add_argument("--timeout", type=DURATION, default=120.0,
                        help="with --repair: how long to keep retrying, a Go duration or seconds "
                        "(default: 2m)")
    add_output_flags(parser)
    parser.set_defaults(func=run)
