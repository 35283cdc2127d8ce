"""``kubevol up``: mount the volumes of pods under a kubelet-style root."""

from __future__ import annotations

import argparse
import sys

from kubevol.cli.exits import UsageError
from kubevol.cli.node_common import (
    VOLUME_COLUMNS,
    Progress,
    add_errors,
    add_root_flags,
    load_manifests,
    open_runtime,
    report_sync,
    settle_states,
    volume_rows,
)
from kubevol.cli.output import Column, Table, add_output_flags, emit
from kubevol.cli.parser import DURATION
from kubevol.errors import KubevolError, SpecError
from kubevol.node.desired import new_pods
from kubevol.node.mountcheck import MountSnapshot
from kubevol.node.privileges import require_privileges
from kubevol.node.records import RecordError, Writer
from kubevol.node.runtime import NodeRuntime
from kubevol.util.deadline import Deadline

TABLE = Table(columns=(*VOLUME_COLUMNS, Column("error", header="WHY NOT", wide=True)),
              name="path")


def run(args: argparse.Namespace) -> int:
    deadline = Deadline.after(args.timeout)
    require_privileges("kubevol up")
    manifests = load_manifests(args.manifests)
    with open_runtime(args, deadline=deadline, exclusive=True) as runtime:
        runtime.learn(manifests)
        # Check every pod before recording any: bad input changes nothing.
        try:
            adding = new_pods(runtime.mgr, manifests)
        except SpecError as exc:
            raise UsageError(str(exc)) from exc
        refuse_agent_pods(runtime, [p.record.uid for p in adding])
        wanted = [p.desired for p in adding]
        # up tears down nothing it was not asked about: the API server (--kubeconfig)
        # serves objects and tokens here, it does not make another owner's pod gone.
        pods = runtime.volume_manager(workers=args.workers, adding=adding,
                                      ask_api_server=False)
        try:
            pods.reconstruct()
            with Progress(pods.manager, deadline, "mounting"):
                result = pods.sync(timeout=args.timeout)
            names = {p.uid: p.name for p in wanted}
            rows = [
                r for r in volume_rows(wanted, pods.manager.actual, None, names,
                                     runtime.host.probe)
                if not wanted or r["pod_uid"] in names
            ]
            manager = pods.manager
            settle_states(rows, MountSnapshot(manager.usage.table(), runtime.host.root_dir,
                                              runtime.host.probe))
        finally:
            pods.close()
        for uid, why in sorted(pods.invalid.items()):
            print(f"warning: recorded pod {uid} cannot be run: {why}", file=sys.stderr)
        add_errors(rows, wanted, result)
        emit(rows, TABLE, args, sys.stdout)
        report_sync(result)
        return 0 if result.converged else 1


def refuse_agent_pods(runtime: NodeRuntime, uids: list[str]) -> None:
    """Raise KubevolError, before anything is written, when a pod UID of the manifests is
    one the agent runs on this root (its record says so): up never takes another owner's
    pod."""
    for uid in uids:
        if not runtime.records.has(uid):
            continue  # a new pod: nothing to read
        try:
            record = runtime.records.read(uid)
        except RecordError:
            continue  # an unreadable record is replaced, as before
        if record is not None and record.runs_for(Writer.AGENT):
            raise KubevolError(
                f"pod UID {uid} ({record.name}) is run by the kubevol agent on this root: not "
                "taken over (give the manifest another metadata.uid, or remove it from the "
                "agent's sources)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Mount the volumes of the pods in MANIFEST files (YAML: Pods with the "
        "PersistentVolumes, PersistentVolumeClaims, ConfigMaps and Secrets they use, and "
        "CSIDriver objects: without --kubeconfig, how to treat a driver) "
        "under --root, as the "
        "kubelet lays them out, and record the pods there. Volumes of pods recorded "
        "before are brought back if they went missing (after a crash). Without "
        "MANIFEST, only brings the recorded pods up to date."
    )
    parser.add_argument("manifests", nargs="*", metavar="MANIFEST", help="YAML manifest file")
    add_root_flags(parser)
    parser.add_argument("--timeout", type=DURATION, default=120.0,
                        help="how long to keep retrying: a Go duration (2m, 90s) or seconds "
                        "(default: 2m)")
    parser.add_argument("--workers", type=int, default=8, help=argparse.SUPPRESS)
    add_output_flags(parser)
    parser.set_defaults(func=run)
