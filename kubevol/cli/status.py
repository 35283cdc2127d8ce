"""``kubevol status``: the volumes under a kubelet-style root, with state and usage."""

from __future__ import annotations

import argparse
import sys

from kubevol.cli.node_common import (
    USAGE_COLUMNS,
    VOLUME_COLUMNS,
    add_metrics,
    add_root_flags,
    open_runtime,
    volume_rows,
)
from kubevol.cli.output import Column, Table, add_output_flags, emit
from kubevol.cli.parser import DURATION
from kubevol.deadline import Deadline
from kubevol.errors import KubevolError
from kubevol.node.desired import desired_pod
from kubevol.node.reconstruct import scan
from kubevol.node.records import PodState
from kubevol.node.state import DesiredPod

TABLE = Table(columns=(*VOLUME_COLUMNS, Column("desired"), *USAGE_COLUMNS), name="path")


def run(args: argparse.Namespace) -> int:
    deadline = Deadline.after(args.timeout)
    with open_runtime(args, deadline=deadline) as runtime:
        records, unreadable = runtime.records.scan()
        for _, why in sorted(unreadable.items()):
            print(f"warning: {why}; skipped", file=sys.stderr)
        desired: list[DesiredPod] = []
        for record in records:
            if record.state is not PodState.RUNNING:
                continue
            try:
                m = record.manifests()
                desired += [desired_pod(runtime.mgr, p, m) for p in m.pods]
            except KubevolError as exc:
                print(f"warning: recorded pod {record.uid}: {exc}", file=sys.stderr)
        found = scan(runtime.host, runtime.mgr)
        names = {r.uid: r.name for r in records}
        rows = volume_rows(desired, None, found, names)
        wanted = {r.uid: r.state.value for r in records}
        for row in rows:
            row["desired"] = wanted.get(row["pod_uid"], "unknown")
        if not args.no_metrics:
            add_metrics(runtime, rows, deadline)
        emit(rows, TABLE, args, sys.stdout)
        return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List every pod volume found under --root and every volume of the pods kubevol "
        "runs there, with its state on disk (mounted, present, not-mounted, corrupted, "
        "unreadable, not set up), what kubevol was asked (running, terminating, or "
        "unknown for pods it did not mount) and its usage. Changes nothing."
    )
    add_root_flags(parser)
    parser.add_argument("--no-metrics", action="store_true", help="do not measure volumes")
    parser.add_argument("--timeout", type=DURATION, default=60.0,
                        help="how long the whole listing may take, measuring included (a "
                        "driver that does not answer leaves its volumes' usage unknown): a "
                        "Go duration (30s, 2m) or seconds (default: 60)")
    add_output_flags(parser)
    parser.set_defaults(func=run)
