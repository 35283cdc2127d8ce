"""What the node commands (``up``, ``down``, ``status``, ``reconstruct``, ``demo``) share:
their common flags, opening the node runtime, rows describing volumes, and reporting a sync."""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TextIO, TypedDict

from kubevol.cli.exits import UsageError
from kubevol.cli.output import Column
from kubevol.cli.parser import DEFAULT_ROOT, ROOT_ENV, default_root
from kubevol.errors import KubevolError, MetricsError, SpecError
from kubevol.mount.probe import PathProbe, UnresponsiveError
from kubevol.node.manager import NodeVolumeManager, SyncResult
from kubevol.node.manifests import Manifests
from kubevol.node.mountcheck import MountCheck, MountSnapshot
from kubevol.node.reconstruct import FoundVolume, Reconstruction
from kubevol.node.state import ActualState, DesiredPod, MountState
from kubevol.plugins import HOST_PATH_PLUGIN_NAME
from kubevol.util.deadline import Deadline

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from kubevol.k8s.tokens import TokenManager
    from kubevol.node.rootlock import RootLock
    from kubevol.node.runtime import NodeRuntime


def add_root_flags(parser: argparse.ArgumentParser, *, drivers: bool = True) -> None:
    """``--root``, ``--node-name``, and ``--csi-driver`` (repeatable)."""
    parser.add_argument(
        "--root", default=default_root(), metavar="DIR",
        help="the kubelet-style root directory (pods/, plugins/ ... live under it; "
        f"default: ${ROOT_ENV}, else {DEFAULT_ROOT})",
    )
    parser.add_argument(
        "--node-name", default=None, help="this node's name (default: the host name)"
    )
    if drivers:
        parser.add_argument(
            "--csi-driver", action="append", default=[], metavar="NAME=ENDPOINT",
            help="a CSI driver to use, e.g. hostpath.csi.kubevol.io=unix:///run/hp.sock; "
            "remembered under the root for later commands (repeatable)",
        )
    parser.add_argument(
        "--guard-policy", choices=("safe", "kubelet"), default="safe",
        help="the unstage guard's rules for CSI device mounts (default: safe)",
    )
    parser.add_argument(
        "--kubeconfig", default=None, metavar="FILE",
        help="read ConfigMaps and Secrets from this API server (after the manifests given) "
        "and get service-account tokens through its TokenRequest API",
    )
    parser.add_argument(
        "--token-provider", default=None, metavar="COMMAND",
        help="a command that issues service-account tokens: it reads a TokenRequest (JSON) "
        "on stdin and prints the answered TokenRequest (status.token, "
        "status.expirationTimestamp); used instead of --kubeconfig's TokenRequest API. A bare "
        "name not on PATH is looked for beside kubevol's own scripts too. Without an API "
        "server: kubevol-stand-in-token-provider (unsigned tokens that nothing accepts)",
    )
    parser.add_argument(
        "--node-label", action="append", default=[], metavar="KEY=VALUE",
        help="a label of this node, checked against local PersistentVolumes' nodeAffinity "
        "(repeatable; kubernetes.io/hostname defaults to the node name)",
    )
    plugins = parser.add_mutually_exclusive_group()
    plugins.add_argument(
        "--plugin", action="append", default=[], metavar="NAME", dest="plugins",
        help="load only this third-party plugin (by plugin name) of those installed through "
        "the 'kubevol.plugins' entry points (repeatable; default: all of them)",
    )
    plugins.add_argument(
        "--no-entry-points", action="store_true",
        help="load no third-party plugin, only the built-in ones",
    )


#: What a kubelet-style root holds (any one of them): the kubelet's directories, or
#: kubevol's own.
ROOT_MARKS = ("pods", "plugins", "plugins_registry", "kubevol")


def require_root(args: argparse.Namespace) -> str:
    """``--root`` as an absolute path, for a command that reads a root or tears down on it:
    raises UsageError when it does not exist, is not a directory, or holds files but none
    of a kubelet's (``/tmp`` given by mistake), so that a wrong root never looks like an
    empty node. (``up`` and ``agent`` make a root that does not exist yet.)"""
    root = os.path.abspath(str(args.root))
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        raise UsageError(f"--root {root}: no such directory (give the kubelet-style root, "
                         f"e.g. {DEFAULT_ROOT}, or set ${ROOT_ENV})") from None
    except NotADirectoryError:
        raise UsageError(f"--root {root}: not a directory") from None
    except OSError as exc:
        raise UsageError(f"--root {root}: {exc.strerror}") from exc
    if names and not set(names) & set(ROOT_MARKS):
        raise UsageError(f"--root {root}: not a kubelet-style root (it has none of "
                         f"{', '.join(n + '/' for n in ROOT_MARKS)})")
    return root


def load_manifests(paths: Sequence[str]) -> Manifests:
    """The manifest files a command was given; a file that cannot be read or is not valid
    is a usage error (nothing was done)."""
    from kubevol.node.manifests import load_manifest_files

    try:
        return load_manifest_files(paths)
    except SpecError as exc:
        raise UsageError(str(exc)) from exc


def open_runtime(
    args: argparse.Namespace, *, deadline: Deadline | None = None, exclusive: bool = False,
    stop: threading.Event | None = None, lock_deadline: Deadline | None = None,
) -> NodeRuntime:
    """The node runtime the flags describe. Raises KubevolError for a bad ``--csi-driver``.

    ``deadline`` (the command's ``--timeout``, from its start) bounds every CSI call and
    wait. ``exclusive`` (commands that change the root) holds the root's lock until the
    runtime closes, waiting for another holder with a message, until ``lock_deadline``
    (default: ``deadline``; the agent's start-up bound) or until ``stop`` is set (the
    agent's signal handler sets it).
    """
    from kubevol.node.runtime import (  # brings grpc: load late
        NodeRuntime,
        check_driver_endpoint,
        parse_driver_flag,
    )

    drivers: dict[str, str] = {}
    for value in getattr(args, "csi_driver", []) or []:
        try:
            name, endpoint = parse_driver_flag(value)
            check_driver_endpoint(name, endpoint)
        except (ValueError, KubevolError) as exc:
            raise UsageError(f"--csi-driver: {exc}") from exc
        drivers[name] = endpoint
    root = os.path.abspath(args.root)
    # Which tree a command reads or changes is never left to guess.
    print(f"kubevol {args.command}: root {root}", file=sys.stderr)
    entry_points: bool | list[str] = (
        False if args.no_entry_points else (args.plugins or True)
    )
    lock = root_lock(args, lock_deadline or deadline, stop) if exclusive else None
    runtime = NodeRuntime(
        root, node_name=args.node_name, csi_drivers=drivers,
        guard_policy=args.guard_policy, **api_options(args), entry_points=entry_points,
        deadline=deadline, lock=lock,
        # A one-shot command refuses a driver given that does not answer (the agent keeps
        # trying it); either way only a driver that answered is remembered.
        drivers_must_answer=not getattr(args, "daemon", False),
    )
    if deadline is not None:
        # A volume that does not answer costs a third of the command's --timeout at most,
        # leaving the rest for the work that does not touch it.
        runtime.host.probe.timeout = min(runtime.host.probe.timeout, deadline.remaining() / 3)
    for problem in runtime.plugin_problems:
        print(f"warning: {problem}", file=sys.stderr)
    # Drivers that are not available were logged as warnings by the runtime: once.
    return runtime


def root_lock(args: argparse.Namespace, deadline: Deadline | None = None,
              stop: threading.Event | None = None) -> RootLock:
    """The lock on ``--root`` (not taken yet) that a command changing the root holds: it
    waits for another holder with a message, until ``deadline`` or ``stop``. (A one-shot
    command's SIGINT ends the wait as KeyboardInterrupt, its SIGTERM ends the process.)"""
    from kubevol.node.rootlock import RootLock

    return RootLock(
        os.path.abspath(args.root), timeout=(deadline or Deadline.never()).remaining(),
        on_wait=lambda message: print(f"kubevol {args.command}: {message}", file=sys.stderr),
        stop=stop,
    )


class ApiOptions(TypedDict, total=False):
    """The :class:`~kubevol.node.runtime.NodeRuntime` keyword arguments of
    :func:`api_options`: each present only when its option was given."""

    kube_client: ApiClient
    tokens: TokenManager
    node_labels: dict[str, str]


def api_options(args: argparse.Namespace) -> ApiOptions:
    """The API client, token manager and node labels that ``--kubeconfig``,
    ``--token-provider`` and ``--node-label`` ask for (NodeRuntime keyword arguments)."""
    import shlex

    from kubevol.k8s.tokens import CommandTokenProvider, TokenManager

    options: ApiOptions = {}
    if getattr(args, "kubeconfig", None):
        from kubernetes import config as kube_config

        try:
            options["kube_client"] = kube_config.new_client_from_config(
                config_file=args.kubeconfig
            )
        except Exception as exc:  # the client raises its own ConfigException and OSErrors
            raise UsageError(
                f"--kubeconfig {args.kubeconfig}: cannot load it: {type(exc).__name__}"
            ) from exc
    if getattr(args, "token_provider", None):
        try:
            argv = beside_kubevol(shlex.split(args.token_provider))
            options["tokens"] = TokenManager(CommandTokenProvider(argv))
        except ValueError as exc:
            raise UsageError(f"--token-provider: {exc}") from exc
    labels: dict[str, str] = {}
    for value in getattr(args, "node_label", None) or []:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise UsageError(f"--node-label: expected KEY=VALUE, got {value!r}")
        labels[key] = label
    if labels:
        options["node_labels"] = labels
    return options


def beside_kubevol(argv: list[str]) -> list[str]:
    """``argv`` with a bare command name that is not on ``PATH`` replaced by the program of
    that name installed beside kubevol (its interpreter's scripts directory, such as a
    virtualenv's ``bin``, which ``sudo`` and service managers leave off ``PATH``)."""
    import shutil
    import sysconfig

    if not argv or os.sep in argv[0] or shutil.which(argv[0]):
        return argv
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        found = shutil.which(argv[0], path=directory)
        if found:
            return [found, *argv[1:]]
    return argv


#: The one vocabulary of a volume's state, the same in ``up``, ``status`` (scanned or
#: answered by the agent) and ``reconstruct`` (its MOUNT column): each word and what it
#: means. The README's "Volume states" lists the same words (a test checks it).
VOLUME_STATES: dict[str, str] = {
    "mounted": "a mount (or a block volume's device link) is in place",
    "present": "set up as a plain directory, which has nothing to mount (an emptyDir on "
    "the node's disk)",
    "host path": "a hostPath volume: the node's own path, which exists",
    "missing": "the volume's path (or a hostPath's node path) does not exist",
    "not-mounted": "its plugin mounts it and nothing is mounted at its path",
    "uncertain": "an operation on it ended without a known outcome; it is retried",
    "corrupted": "a mount is there but cannot be read (a dead filesystem)",
    "unresponsive": "a network or FUSE mount that did not answer in time (left as it is)",
    "not set up": "a volume of a pod kubevol runs that is not set up yet (or failed)",
    "unreadable": "its directory or vol_data.json could not be read back",
    "unknown plugin": "a volume of a plugin kubevol does not have (left alone)",
}


def settle_states(rows: Iterable[dict[str, object]], mounts: MountSnapshot) -> None:
    """Turn the actual state's words in ``rows`` (``up``, the agent's answer) into those
    a scan of the disk gives (:data:`VOLUME_STATES`): a volume set up is looked at to say
    whether it is a mount or a plain directory, a hostPath is its node path."""
    for row in rows:
        if row["state"] == MountState.MOUNTED:
            if row["plugin"] == HOST_PATH_PLUGIN_NAME:
                row["state"] = _host_path_state(str(row["path"]), mounts.probe)
            else:
                row["state"] = state_of_path(mounts, str(row["path"]),
                                             device=row["device"] is not None)
        elif row["state"] == MountState.UNMOUNTED:
            row["state"] = MountCheck.NOT_MOUNTED.value
        if row["device"] == MountState.UNMOUNTED:
            row["device"] = MountCheck.NOT_MOUNTED.value


def state_of_path(mounts: MountSnapshot, path: str, *, device: bool) -> str:
    """What a scan reports for a volume kubevol knows is set up at ``path`` (``device``:
    its plugin mounts a device first): ``present`` for a plain directory, else what the
    mount check finds there (``unresponsive`` included)."""
    return _state_word(mounts.check(path), device=device)


def state_of(found: FoundVolume) -> str:
    """What the mount check means for this kind of volume, in one word."""
    return _state_word(found.mount, device=found.device_mountable or found.attachable)


def _state_word(check: MountCheck, *, device: bool) -> str:
    if check is MountCheck.NOT_MOUNTED and not device:
        return "present"  # a plain directory volume (emptyDir on disk)
    return check.value


def _row(names: dict[str, str], uid: str, spec_name: str, **fields: object) -> dict[str, object]:
    return {"pod": names.get(uid, uid), "pod_uid": uid, "spec_name": spec_name, **fields}


def volume_rows(
    desired: Sequence[DesiredPod],
    actual: ActualState | None,
    found: Reconstruction | None,
    names: dict[str, str],
    probe: PathProbe | None = None,
) -> list[dict[str, object]]:
    """One row per pod volume: from the actual state when given, else from a scan.

    ``desired`` supplies outer names (and hostPath volumes, which leave nothing on disk,
    looked at through ``probe``); ``names`` maps pod UIDs to ``namespace/name``.
    """
    rows: dict[tuple[str, str, str], dict[str, object]] = {}
    if actual is not None:
        for av in actual.volumes():
            device = av.device_state.value if av.device_mountable else None
            for m in av.pods:
                rows[(m.pod_uid, av.plugin_name, m.spec_name)] = _row(
                    names, m.pod_uid, m.spec_name, volume=m.outer_name,
                    plugin=av.plugin_name, path=m.path, state=m.state.value, device=device,
                )
    if found is not None:
        for f in found.volumes:
            d = f.dir
            rows.setdefault((d.pod_uid, d.plugin_name, d.spec_name), _row(
                names, d.pod_uid, d.spec_name, volume=d.spec_name, plugin=d.plugin_name,
                path=f.mount_path, state=state_of(f), device=f.device.value if f.device else None,
            ))
        for failed in found.failures:
            d = failed.dir
            rows[(d.pod_uid, d.plugin_name, d.spec_name)] = _row(
                names, d.pod_uid, d.spec_name, volume=d.spec_name, plugin=d.plugin_name,
                path=d.path, state="unreadable", device=None, error=failed.reason,
            )
        for unknown in found.unknown:
            d = unknown.dir
            rows[(d.pod_uid, d.plugin_name, d.spec_name)] = _row(
                names, d.pod_uid, d.spec_name, volume=d.spec_name, plugin=d.plugin_name,
                path=d.path, state="unknown plugin", device=None, error=unknown.reason,
            )
    for pod in desired:
        for v in pod.volumes:
            key = (v.pod_uid, v.plugin_name, v.spec_name)
            if key in rows:
                rows[key]["volume"] = v.outer_name
                continue
            path, state = "", "not set up"
            if v.plugin_name == HOST_PATH_PLUGIN_NAME:
                path = v.volume_name
                state = _host_path_state(path, probe)
            rows[key] = _row(
                names, v.pod_uid, v.spec_name, volume=v.outer_name, plugin=v.plugin_name,
                path=path, state=state, device=None,
            )
    return [rows[k] for k in sorted(rows, key=lambda k: (str(rows[k]["pod"]), k[2]))]


def _host_path_state(path: str, probe: PathProbe | None) -> str:
    """A hostPath keeps nothing under the pod: the node's path is the volume, on any
    filesystem (a dead server's too, where an ``lstat`` blocks: hence ``probe``)."""
    look = functools.partial(os.path.lexists, path)
    try:
        exists = probe.call(path, path, "lstat", look) if probe is not None else look()
    except UnresponsiveError:
        return MountCheck.UNRESPONSIVE.value
    return "host path" if exists else "missing"


def add_metrics(
    runtime: NodeRuntime, rows: Iterable[dict[str, object]], deadline: Deadline | None = None
) -> None:
    """Fill ``used``/``capacity``/``available`` (bytes, None when unknown) of each row from
    its plugin; ``metrics_error`` says why they are unknown when measuring failed. Once
    ``deadline`` has passed, the volumes not measured yet are left unknown with that reason
    (a CSI call in flight is bounded by the runtime's deadline already)."""
    for row in rows:
        row.update(used=None, capacity=None, available=None)
        if row["state"] in ("not set up", "unreadable", "unknown plugin", "missing", "corrupted"):
            continue
        if row["state"] == MountCheck.UNRESPONSIVE:
            row["metrics_error"] = "not measured: the volume did not answer its stat"
            continue
        if deadline is not None and deadline.expired:
            row["metrics_error"] = "not measured: --timeout reached"
            continue
        path = str(row["path"])
        try:
            plugin = runtime.mgr.find_plugin_by_name(str(row["plugin"]))
            unmounter = plugin.new_unmounter(str(row["spec_name"]), str(row["pod_uid"]))
            # du and statfs walk below the mount point: with a deadline, as any such call.
            metrics = runtime.host.probe.call(
                path, path, "measuring usage", unmounter.get_metrics,
                timeout=deadline.cap(runtime.host.probe.timeout) if deadline else None)
        except UnresponsiveError as exc:
            row.update(state=MountCheck.UNRESPONSIVE, metrics_error=str(exc))
            continue
        except (KubevolError, MetricsError, OSError, ValueError) as exc:
            row["metrics_error"] = str(exc)
            continue
        row.update(used=metrics.used, capacity=metrics.capacity, available=metrics.available)


#: The columns of a volume row (see :func:`volume_rows`), usage last.
VOLUME_COLUMNS = (
    Column("pod"),
    Column("volume"),
    Column("plugin"),
    Column("path"),
    Column("state"),
    Column("device", wide=True),
    Column("pod_uid", wide=True),
)
USAGE_COLUMNS = (
    Column("used", size=True),
    Column("capacity", size=True),
    Column("available", size=True, wide=True),
    Column("metrics_error", header="WHY NO USAGE", wide=True),
)


#: The kubelet's words for a CSI driver that is not registered.
_DRIVER_MISSING = "not found in the list of registered CSI drivers"


def hint_for(error: BaseException | str) -> str:
    """What to do about ``error``, as a sentence to append; "" when there is nothing to say."""
    if _DRIVER_MISSING in str(error):
        return ("start the driver and give it once with --csi-driver NAME=ENDPOINT (then "
                "remembered under the root; kubevol csi-drivers list shows those known)")
    return ""


def with_hint(error: BaseException | str) -> str:
    """``error``'s text, then what to do about it when :func:`hint_for` knows."""
    hint = hint_for(error)
    return f"{error}: {hint}" if hint else str(error)


def not_done(result: SyncResult) -> dict[str, object] | None:
    """Why a sync did not do everything (None when it did), as ``-o json`` shows it:
    ``reason``, ``pending`` work and ``failures`` (``kind``, ``key``, ``error``)."""
    if result.converged:
        return None
    return {
        "reason": "only final errors are left" if result.stuck else "the time ran out",
        "pending": list(result.pending),
        "failures": [{"kind": str(f.kind), "key": str(f.key), "error": with_hint(f.error)}
                     for f in result.failures],
    }


def add_errors(rows: Sequence[dict[str, object]], desired: Sequence[DesiredPod],
               result: SyncResult) -> None:
    """Give each row of a volume the sync did not set up an ``error``: its operation's last
    failure (with what to do), else why the sync stopped."""
    if result.converged:
        return
    failed: dict[tuple[str, str], str] = {}
    for pod in desired:
        for v in pod.volumes:
            for f in result.failures:
                if f.key.volume == v.unique_name and f.key.pod in ("", v.pod_uid):
                    failed[(v.pod_uid, v.spec_name)] = f"{f.kind}: {with_hint(f.error)}"
    stopped = "not done: " + ("only final errors are left" if result.stuck
                              else "the time ran out")
    for row in rows:
        error = failed.get((str(row["pod_uid"]), str(row["spec_name"])))
        if error is None and row["state"] in ("mounted", "present", "host path"):
            continue
        row["error"] = error or stopped


def report_sync(result: SyncResult, out: TextIO | None = None) -> None:
    """Say what is left and why, when a sync did not converge (on ``out``, else the
    current standard error: looked up when called, not when this module was loaded),
    with what to do where that is known."""
    if result.converged:
        return
    out = out if out is not None else sys.stderr
    why = "only final errors are left" if result.stuck else "the time ran out"
    print(f"not done ({why}):", file=out)
    for item in result.pending:
        print(f"  pending: {item}", file=out)
    for failure in result.failures:
        print(f"  {failure.kind} {failure.key}: {with_hint(failure.error)}", file=out)


#: How often a long wait says, on a terminal, what it waits for (seconds).
PROGRESS_PERIOD = 5.0


class Progress:
    """While a sync runs (a context manager), say every ``period`` seconds on ``stream``
    (stderr) what is being waited for and why: the operations running, the first failure
    with what to do. Only on a terminal: a script's stderr gets the final report alone."""

    def __init__(self, manager: NodeVolumeManager, deadline: Deadline, doing: str, *,
                 stream: TextIO | None = None, period: float = PROGRESS_PERIOD) -> None:
        self.manager = manager
        self.deadline = deadline
        self.doing = doing
        self.stream = stream if stream is not None else sys.stderr
        self.period = period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()

    def __enter__(self) -> Progress:
        if self.stream.isatty():
            self._thread = threading.Thread(target=self._loop, name="kubevol-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            running = self.manager.executor.pending()
            failures = self.manager.executor.failures()
            if not running and not failures:
                continue
            left = self.deadline.remaining()
            line = (f"still {self.doing} after {time.monotonic() - self._started:.0f}s"
                    + (f" ({left:.0f}s left of --timeout)" if math.isfinite(left) else "")
                    + f": {len(running)} operations running")
            if failures:
                f = failures[0]
                line += (f", {len(failures)} failing and retried, e.g. {f.kind} {f.key}: "
                         f"{with_hint(f.error)}")
            print(line, file=self.stream, flush=True)
