"""``kubevol agent``: the long-running node agent (run it under systemd, see contrib/)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from kubevol.cli.exits import UsageError
from kubevol.cli.node_common import add_root_flags, open_runtime
from kubevol.cli.parser import DURATION
from kubevol.node.privileges import require_privileges
from kubevol.util.deadline import Deadline

#: The default metrics address, on loopback only. Not the kubelet's read-only port 10255
#: (nor any port of the kubelet: 10248 healthz, 10250 API; of kube-proxy: 10249, 10256; of
#: the control plane: 10257-10259; of the CSI sidecars: 9808-9809), so that an agent and a
#: kubelet can share a node.
DEFAULT_METRICS_ADDRESS = "127.0.0.1:10264"
#: Ports the agent's metrics must not default to: the kubelet's and kube-proxy's.
KUBELET_PORTS = frozenset({10248, 10249, 10250, 10255, 10256})


def metrics_address(text: str) -> str:
    """``--metrics-address``: ``HOST:PORT`` with a port from 0 to 65535 (empty: off);
    anything else is a usage error."""
    if not text:
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected HOST:PORT with a port from 0 to 65535")
    if not host:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT (e.g. 127.0.0.1:{port})")
    return text


metrics_address.__name__ = "HOST:PORT"


def run(args: argparse.Namespace) -> int:
    require_privileges("kubevol agent")
    from kubevol.node.rootlock import RootWaitStopped

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("kubevol.agent").info(
            "%s: stopping (volumes stay mounted)", signal.Signals(signum).name
        )
        stop.set()

    port = args.metrics_address.rpartition(":")[2]
    if port.isdigit() and int(port) in KUBELET_PORTS:
        print(f"warning: --metrics-address {args.metrics_address}: port {port} is one a "
              "kubelet or kube-proxy on this node listens on", file=sys.stderr)
    if args.manifests and os.path.exists(args.manifests) and not os.path.isdir(args.manifests):
        raise UsageError(f"--manifests {args.manifests}: not a directory (the static pod "
                         "directory; one that does not exist yet is waited for)")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return _serve(args, stop)
    except RootWaitStopped as exc:
        # Stopped before it held the root: nothing was started, nothing to undo.
        logging.getLogger("kubevol.agent").info("%s", exc)
        return 0


def _serve(args: argparse.Namespace, stop: threading.Event) -> int:
    from kubevol.cli.status import agent_rows
    from kubevol.node.agent import Agent
    from kubevol.node.agent_status import StatusServer
    from kubevol.node.api_pods import APIServerPods
    from kubevol.node.sdnotify import SystemdNotifier
    from kubevol.plugins.csi.registration.nodeinfo import NodeInfoManager

    # The agent holds the root for its lifetime: a one-shot command waits for it to stop;
    # a signal while the agent waits for another holder ends the wait (RootWaitStopped).
    with open_runtime(args, exclusive=True, stop=stop,
                      lock_deadline=Deadline.after(args.timeout)) as runtime, Agent(
        runtime,
        manifest_dir=args.manifests,
        api_pods=(
            APIServerPods(runtime.host.get_kube_client(), runtime.host.node_name)
            if args.kubeconfig else None
        ),
        node_info=(
            NodeInfoManager(runtime.host.get_kube_client(), runtime.host.node_name)
            if args.kubeconfig else None
        ),
        plugins_registry=(
            runtime.host.get_plugins_registry_dir()
            if args.plugins_registry is None else args.plugins_registry or None
        ),
        metrics_address=args.metrics_address or None,
        stats_period=args.volume_stats_agg_period,
        max_backoff=args.max_backoff,
        notifier=SystemdNotifier.from_environment(),
    ) as agent, StatusServer(
        runtime.host.root_dir, lambda: agent_rows(agent), ready=agent.ready.is_set
    ):
        agent.run(stop)
    for what, why in sorted(agent.invalid.items()):
        print(f"warning: {what} could not be run: {why}", file=sys.stderr)
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run until SIGTERM or SIGINT: reconstruct what is mounted under --root, then keep "
        "the volumes of the pods in --manifests (a static-pod directory, watched with "
        "inotify) and, with --kubeconfig, of the pods bound to --node-name on that API "
        "server (listed and watched; their claims, ConfigMaps and Secrets read from it) "
        "mounted, tearing down those of pods whose manifest goes, or that the API server "
        "deletes or reports terminated (Succeeded/Failed); registered CSI drivers are then "
        "published in the node's CSINode and csi.volume.kubernetes.io/nodeid annotation. "
        "`kubevol status` on the same root asks the agent (over <root>/kubevol/agent.sock) "
        "instead of scanning. Volumes stay "
        "mounted when the agent stops. Serves /metrics (kubelet_volume_stats_*, "
        "storage_operation_duration_seconds, kubevol_reconciler_*) and /healthz on "
        "--metrics-address. With $NOTIFY_SOCKET set (systemd Type=notify) it reports "
        "READY=1 after the first reconcile pass, STOPPING=1, and WATCHDOG=1 when "
        "$WATCHDOG_USEC asks for it."
    )
    add_root_flags(parser)
    parser.add_argument(
        "--manifests", metavar="DIR", default=None,
        help="static pod directory: files of Pods with the PersistentVolumes, Claims, "
        "ConfigMaps and Secrets they use, as kubevol up takes them (the kubelet's "
        "--pod-manifest-path; *.yaml, *.yml, *.json). One that does not exist yet is "
        "waited for, as the kubelet waits",
    )
    parser.add_argument(
        "--plugins-registry", metavar="DIR", default=None,
        help="register CSI drivers whose registration sockets appear here (the "
        "node-driver-registrar protocol); empty: none (default: <root>/plugins_registry)",
    )
    parser.add_argument(
        "--metrics-address", metavar="HOST:PORT", default=DEFAULT_METRICS_ADDRESS,
        type=metrics_address,
        help=f"where to serve /metrics and /healthz; empty: not served (default: "
        f"{DEFAULT_METRICS_ADDRESS}, a port no kubelet uses: its read-only 10255 stays free)",
    )
    # For tests that kill the agent: retry failed operations sooner than the kubelet's 2m2s.
    parser.add_argument("--max-backoff", type=DURATION, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--volume-stats-agg-period", type=DURATION, default=60.0, metavar="DURATION",
        help="how often volume usage is measured for /metrics: a Go duration (default: 1m)",
    )
    parser.add_argument(
        "--timeout", type=DURATION, default=120.0, metavar="DURATION",
        help="how long start-up may wait for the root (held by a one-shot command or "
        "another agent) before it gives up; once running, a volume that does not answer "
        "costs its own deadline only: a Go duration (default: 2m)",
    )
    parser.set_defaults(func=run, daemon=True)
