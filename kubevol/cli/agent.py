"""``kubevol agent``: the long-running node agent (run it under systemd, see contrib/)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from kubevol.cli.node_common import add_root_flags, open_runtime
from kubevol.cli.parser import DURATION
from kubevol.node.privileges import require_privileges

#: The default metrics address (the kubelet's read-only port, on loopback only).
DEFAULT_METRICS_ADDRESS = "127.0.0.1:10255"


def run(args: argparse.Namespace) -> int:
    require_privileges("kubevol agent")
    from kubevol.cli.status import agent_rows
    from kubevol.node.agent import Agent
    from kubevol.node.agent_status import StatusServer
    from kubevol.node.api_pods import APIServerPods
    from kubevol.node.sdnotify import SystemdNotifier
    from kubevol.plugins.csi.registration.nodeinfo import NodeInfoManager

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("kubevol.agent").info(
            "%s: stopping (volumes stay mounted)", signal.Signals(signum).name
        )
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # The agent holds the root for its lifetime: a one-shot command waits for it to stop.
    with open_runtime(args, exclusive=True) as runtime, Agent(
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
        help="static pod directory: YAML files of Pods with the PersistentVolumes and "
        "Claims they use (the kubelet's --pod-manifest-path)",
    )
    parser.add_argument(
        "--plugins-registry", metavar="DIR", default=None,
        help="register CSI drivers whose registration sockets appear here (the "
        "node-driver-registrar protocol); empty: none (default: <root>/plugins_registry)",
    )
    parser.add_argument(
        "--metrics-address", metavar="HOST:PORT", default=DEFAULT_METRICS_ADDRESS,
        help=f"where to serve /metrics and /healthz; empty: not served "
        f"(default: {DEFAULT_METRICS_ADDRESS})",
    )
    # For tests that kill the agent: retry failed operations sooner than the kubelet's 2m2s.
    parser.add_argument("--max-backoff", type=DURATION, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--volume-stats-agg-period", type=DURATION, default=60.0, metavar="DURATION",
        help="how often volume usage is measured for /metrics: a Go duration (default: 1m)",
    )
    parser.set_defaults(func=run, daemon=True)
