"""``kubevol down``: tear down the volumes of pods under a kubelet-style root."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import attrs

from kubevol.cli.node_common import add_root_flags, open_runtime, report_sync
from kubevol.cli.parser import DURATION
from kubevol.errors import KubevolError
from kubevol.mount.mountread import read_mountinfo_bytes
from kubevol.mount.table import MountTable
from kubevol.node.manifests import load_manifest_files, manifest_pod_uid
from kubevol.node.mountcheck import mounts_by_pod
from kubevol.node.privileges import require_privileges
from kubevol.node.records import PodRecord, PodState, RecordError
from kubevol.node.validation import validate_pod_uid
from kubevol.util.deadline import Deadline

if TYPE_CHECKING:
    from kubevol.node.runtime import NodeRuntime  # brings grpc: loaded by open_runtime


def run(args: argparse.Namespace) -> int:
    deadline = Deadline.after(args.timeout)
    require_privileges("kubevol down")
    if bool(args.manifests) == bool(args.pod_uid):
        raise KubevolError("give either POD_MANIFEST files or --pod-uid, not both or neither")
    if args.manifests:
        uids = [manifest_pod_uid(p) for p in load_manifest_files(args.manifests).pods]
    else:
        uids = [validate_pod_uid(u) for u in args.pod_uid]
    with open_runtime(args, deadline=deadline, exclusive=True) as runtime:
        terminating = []
        for uid in uids:
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
        # One flush for all the records, not two per pod.
        runtime.records.write_many(terminating)
        pods = runtime.volume_manager(workers=args.workers)
        try:
            pods.reconstruct()
            result = pods.sync(timeout=args.timeout)
        finally:
            pods.close()
        # Never "gone" while anything of the pod is mounted, whatever the records say.
        table = MountTable(read_mountinfo_bytes())
        by_pod = mounts_by_pod(runtime.host.root_dir, table)
        mounted = {u: by_pod.get(u, []) for u in uids}
        left = [u for u in uids if mounted[u] or _recorded(runtime, u)]
        for uid in uids:
            if uid not in left:
                print(f"{uid}: gone")
            elif mounted[uid]:
                print(f"{uid}: still being torn down ({len(mounted[uid])} mounts left, "
                      f"e.g. {mounted[uid][0]})")
            else:
                print(f"{uid}: still being torn down")
        report_sync(result, sys.stderr)
        # The pods asked for decide: another pod stuck on the root is reported, not ours.
        return 0 if not left else 1


def _recorded(runtime: NodeRuntime, uid: str) -> bool:
    try:
        return runtime.records.read(uid) is not None
    except RecordError:
        return True


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Unmount the volumes of the pods named by POD_MANIFEST files (or by --pod-uid), "
        "unstage and detach devices no other pod uses, and remove the pods' directories. "
        "Works after a crash: what is mounted is found on disk."
    )
    parser.add_argument("manifests", nargs="*", metavar="POD_MANIFEST")
    parser.add_argument("--pod-uid", action="append", default=[], metavar="UID",
                        help="a pod to tear down by UID (repeatable)")
    add_root_flags(parser)
    parser.add_argument("--timeout", type=DURATION, default=120.0,
                        help="how long to keep retrying: a Go duration (2m, 90s) or seconds "
                        "(default: 2m)")
    parser.add_argument("--workers", type=int, default=8, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)
