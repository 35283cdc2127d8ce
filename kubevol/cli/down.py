"""``kubevol down``: tear down the volumes of pods under a kubelet-style root."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

import attrs

from kubevol.cli.exits import UsageError
from kubevol.cli.node_common import (
    Progress,
    add_root_flags,
    load_manifests,
    not_done,
    open_runtime,
    report_sync,
    require_root,
)
from kubevol.cli.output import Column, Table, add_output_flags, columns, emit
from kubevol.cli.parser import DURATION
from kubevol.errors import KubevolError
from kubevol.mount.mountread import read_mountinfo_bytes
from kubevol.mount.table import MountTable
from kubevol.node.manifests import manifest_pod_uid
from kubevol.node.mountcheck import mounts_by_pod
from kubevol.node.privileges import require_privileges
from kubevol.node.records import PodRecord, PodState, RecordError
from kubevol.node.validation import validate_pod_uid
from kubevol.util.deadline import Deadline

if TYPE_CHECKING:
    from kubevol.node.runtime import NodeRuntime  # brings grpc: loaded by open_runtime

#: ``-o`` tables: one row per pod asked for, then what the tear-down left not done.
TABLES = (
    Table(columns=columns("pod_uid", "state", Column("mounts_left", header="MOUNTS LEFT"),
                          Column("example", wide=True)),
          at="pods", name="pod_uid"),
    Table(columns=columns("kind", "key", "error"), at="not_done.failures",
          title="not done"),
)


def run(args: argparse.Namespace) -> int:
    deadline = Deadline.after(args.timeout)
    require_privileges("kubevol down")
    if bool(args.manifests) == bool(args.pod_uid):
        raise UsageError("give either POD_MANIFEST files or --pod-uid, not both or neither")
    require_root(args)
    try:
        if args.manifests:
            uids = [manifest_pod_uid(p) for p in load_manifests(args.manifests).pods]
        else:
            uids = [validate_pod_uid(u) for u in args.pod_uid]
    except KubevolError as exc:
        raise UsageError(str(exc)) from exc
    with open_runtime(args, deadline=deadline, exclusive=True) as runtime:
        # Read once, and only for a pod with neither a record nor a directory.
        before = functools.cache(lambda: mounts_by_pod(
            runtime.host.root_dir, MountTable(read_mountinfo_bytes())))
        # A pod kubevol has no trace of (no record, no directory, nothing mounted) is not
        # found, as kubectl delete says NotFound: a typo in a UID is not "gone".
        missing = [u for u in uids if not _known(runtime, u, before)]
        asked = [u for u in uids if u not in missing]
        terminating = []
        for uid in asked:
            try:
                old = runtime.records.read(uid)
            except RecordError as exc:
                # Torn down all the same, from what is on disk; the bad record is replaced.
                print(f"warning: {exc}; replaced", file=sys.stderr)
                old = None
            terminating.append(
                attrs.evolve(old, state=PodState.TERMINATING) if old is not None
                else PodRecord(uid=uid, state=PodState.TERMINATING, objects=())
            )
        # Written first (one flush for all), not read back.
        pods = runtime.volume_manager(workers=args.workers, terminating=terminating)
        try:
            pods.reconstruct()
            # The volumes of the pods asked for: their failures (an unstage refused) are
            # this command's; another pod stuck on the root is reported, not counted.
            ours = {m.unique_name for av in pods.manager.actual.volumes() for m in av.pods
                    if m.pod_uid in asked}
            with Progress(pods.manager, deadline, "tearing down"):
                result = pods.sync(timeout=args.timeout)
        finally:
            pods.close()
        # Never "gone" while anything of the pod is mounted, whatever the records say.
        by_pod = mounts_by_pod(runtime.host.root_dir, MountTable(read_mountinfo_bytes()))
        failed = [f for f in result.failures
                  if f.key.volume in ours or f.key.pod in asked]
        rows = [_row(runtime, uid, by_pod.get(uid, []), uid in missing) for uid in uids]
        ours_done = attrs.evolve(result, failures=tuple(failed),
                                 converged=result.converged or not failed)
        left = [r for r in rows if r["state"] != "gone"]
        why = None
        if left or not ours_done.converged:
            why = not_done(ours_done) or {"reason": "pods left", "pending": [], "failures": []}
            why["pods"] = [f"{r['pod_uid']}: {r['state']}" for r in left]
        _print(rows, why, args)
        if not ours_done.converged:
            report_sync(ours_done, sys.stderr)
        for r in left:
            if r["state"] == NOT_FOUND:
                print(f"kubevol down: pod {r['pod_uid']} not found under "
                      f"{runtime.host.root_dir} (no record, no directory, nothing mounted)",
                      file=sys.stderr)
        if args.ignore_not_found:
            left = [r for r in left if r["state"] != NOT_FOUND]
        return 0 if not left and ours_done.converged else 1


#: A pod asked for of which kubevol found no trace.
NOT_FOUND = "not found"


def _known(runtime: NodeRuntime, uid: str,
           mounts: Callable[[], dict[str, list[str]]]) -> bool:
    return (runtime.records.has(uid) or os.path.lexists(runtime.host.get_pod_dir(uid))
            or bool(mounts().get(uid)))


class _PodRow(TypedDict):
    """What ``down`` says of one pod asked for."""

    pod_uid: str
    #: ``gone``, ``terminating`` or ``not found``.
    state: str
    mounts_left: int
    #: One of the mounts left, None when none is.
    example: str | None


def _row(runtime: NodeRuntime, uid: str, mounted: list[str], missing: bool) -> _PodRow:
    if missing:
        state = NOT_FOUND
    elif mounted or _recorded(runtime, uid):
        state = "terminating"
    else:
        state = "gone"
    return {"pod_uid": uid, "state": state, "mounts_left": len(mounted),
            "example": mounted[0] if mounted else None}


def _print(rows: list[_PodRow], why: dict[str, object] | None,
           args: argparse.Namespace) -> None:
    """``-o``'s format (the rows under ``pods``, ``why`` under ``not_done``); without
    ``-o``, one line a pod (``UID: gone``)."""
    if "output" in args:
        emit({"pods": rows, "not_done": why}, TABLES, args, sys.stdout)
        return
    for row in rows:
        if row["state"] == "gone":
            print(f"{row['pod_uid']}: gone")
        elif row["state"] == NOT_FOUND:
            print(f"{row['pod_uid']}: not found")
        elif row["mounts_left"]:
            print(f"{row['pod_uid']}: still being torn down ({row['mounts_left']} mounts "
                  f"left, e.g. {row['example']})")
        else:
            print(f"{row['pod_uid']}: still being torn down")


def _recorded(runtime: NodeRuntime, uid: str) -> bool:
    try:
        return runtime.records.read(uid) is not None
    except RecordError:
        return True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Unmount the volumes of the pods named by POD_MANIFEST files (or by --pod-uid), "
        "unstage and detach devices no other pod uses, and remove the pods' directories. "
        "Works after a crash: what is mounted is found on disk. Exits 0 only when every "
        "pod asked for is gone and each of its volumes torn down (unstaged, detached); "
        "else 1, naming what is not done and why (on stderr, and under not_done in -o "
        "json). A pod of which nothing is found under --root is 'not found' (exit 1, as "
        "kubectl delete says NotFound) unless --ignore-not-found. Without -o: one line a "
        "pod, 'UID: gone'."
    )
    parser.add_argument("manifests", nargs="*", metavar="POD_MANIFEST")
    parser.add_argument("--pod-uid", action="append", default=[], metavar="UID",
                        help="a pod to tear down by UID (repeatable)")
    parser.add_argument("--ignore-not-found", action="store_true",
                        help="a pod of which nothing is found is not an error (as kubectl's)")
    add_root_flags(parser)
    parser.add_argument("--timeout", type=DURATION, default=120.0,
                        help="how long to keep retrying: a Go duration (2m, 90s) or seconds "
                        "(default: 2m)")
    parser.add_argument("--workers", type=int, default=8, help=argparse.SUPPRESS)
    add_output_flags(parser, suppress=True)
    parser.set_defaults(func=run)

