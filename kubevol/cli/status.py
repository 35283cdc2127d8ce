"""``kubevol status``: the volumes under a kubelet-style root, with state and usage."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kubevol import layout
from kubevol.cli import exits
from kubevol.cli.node_common import (
    USAGE_COLUMNS,
    VOLUME_COLUMNS,
    VOLUME_STATES,
    add_metrics,
    add_root_flags,
    open_runtime,
    require_root,
    settle_states,
    volume_rows,
)
from kubevol.cli.output import Column, Table, add_output_flags, emit
from kubevol.cli.parser import DURATION
from kubevol.errors import KubevolError
from kubevol.node.agent_status import ask_agent
from kubevol.node.desired import desired_pod
from kubevol.node.mountcheck import MountCheck, MountSnapshot
from kubevol.node.reconstruct import scan
from kubevol.node.records import PodState
from kubevol.node.state import DesiredPod
from kubevol.util.deadline import Deadline

if TYPE_CHECKING:
    from kubevol.node.agent import Agent

TABLE = Table(columns=(*VOLUME_COLUMNS, Column("desired"), *USAGE_COLUMNS), name="path")


def run(args: argparse.Namespace) -> int:
    deadline = Deadline.after(args.timeout)
    warn_wide_root(require_root(args))
    if not args.scan:
        root = os.path.abspath(args.root)
        started = time.monotonic()
        rows = ask_agent(root, timeout=deadline.cap(AGENT_TIMEOUT))
        if rows is not None:
            print(f"kubevol status: root {root}: answered by the running agent in "
                  f"{(time.monotonic() - started) * 1000:.0f} ms (--scan to scan instead)",
                  file=sys.stderr)
            if not args.no_metrics:
                with open_runtime(args, deadline=deadline) as runtime:
                    add_metrics(runtime, rows, deadline)
            emit(rows, TABLE, args, sys.stdout)
            return report_unresponsive(rows)
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
                desired += [desired_pod(runtime.mgr, p, m, accepted=True) for p in m.pods]
            except KubevolError as exc:
                print(f"warning: recorded pod {record.uid}: {exc}", file=sys.stderr)
        found = scan(runtime.host, runtime.mgr)
        names = {r.uid: r.name for r in records}
        rows = volume_rows(desired, None, found, names, runtime.host.probe)
        wanted = {r.uid: r.state.value for r in records}
        for row in rows:
            row["desired"] = wanted.get(str(row["pod_uid"]), "unknown")
        if not args.no_metrics:
            add_metrics(runtime, rows, deadline)
        emit(rows, TABLE, args, sys.stdout)
        return report_unresponsive(rows)


def report_unresponsive(rows: Sequence[Mapping[str, object]]) -> int:
    """Name the volumes that did not answer on stderr; the exit code."""
    return exits.report_unresponsive(
        (f"pod {r['pod']} volume {r['volume']} at {r['path']}",
         str(r.get("metrics_error") or "stat did not answer"))
        for r in rows if r["state"] == MountCheck.UNRESPONSIVE
    )


def warn_wide_root(root: str) -> None:
    """Say on stderr when the root is open to more than its owner and group (wider than the
    kubelet's 0750): its pods' Secrets and emptyDirs are then as open as their own modes.
    Only said: the directory may be a kubelet's, and kubevol changes no mode it did not
    set."""
    try:
        mode = stat.S_IMODE(os.stat(root).st_mode)
    except OSError:
        return
    if mode & ~layout.DATA_DIR_MODE:
        print(f"warning: root {root} has mode {mode:04o}, wider than the kubelet's "
              f"{layout.DATA_DIR_MODE:04o}: other users may reach the pods' volumes "
              f"(chmod {layout.DATA_DIR_MODE:o} {root})", file=sys.stderr)


#: How long status waits for a running agent's answer before it scans (seconds).
AGENT_TIMEOUT = 5.0


def agent_rows(agent: Agent) -> list[dict[str, object]]:
    """What ``status`` shows, from a running agent's own state (its records, desired and
    actual state): no scan of the root. A volume the agent has mounted is looked at only
    to say, as a scan would, whether it is a mount or a plain directory."""
    records = dict(agent.pods.records)
    manager = agent.pods.manager
    host = agent.runtime.host
    rows = volume_rows(manager.desired.pods(), manager.actual, None,
                       {uid: r.name for uid, r in records.items()}, host.probe)
    settle_states(rows, MountSnapshot(manager.usage.table(), host.root_dir, host.probe))
    for row in rows:
        record = records.get(str(row["pod_uid"]))
        row["desired"] = record.state.value if record is not None else "unknown"
    return rows


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List every pod volume found under --root and every volume of the pods kubevol "
        "runs there, with its state on disk (the words up and reconstruct use too: "
        f"{', '.join(VOLUME_STATES)}), what kubevol was asked (running, terminating, or "
        "unknown for pods it did not mount) and its usage. Changes nothing. When a "
        "kubevol agent runs on the root, it answers (what it mounted, from its own state) "
        "and the root is not scanned; --scan scans anyway."
    )
    add_root_flags(parser)
    parser.add_argument("--no-metrics", action="store_true", help="do not measure volumes")
    parser.add_argument("--scan", action="store_true",
                        help="scan the root even when a running agent could answer")
    parser.add_argument("--timeout", type=DURATION, default=60.0,
                        help="how long the whole listing may take, measuring included (a "
                        "driver that does not answer leaves its volumes' usage unknown): a "
                        "Go duration (30s, 2m) or seconds (default: 60)")
    add_output_flags(parser)
    parser.set_defaults(func=run)
