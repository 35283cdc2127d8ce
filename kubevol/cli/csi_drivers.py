"""``kubevol csi-drivers list|forget``: the CSI drivers remembered under a root.

A driver given once with ``--csi-driver NAME=ENDPOINT`` (and that answered) is remembered
in ``<root>/kubevol/csi-drivers.json`` so that later commands on the root reach it again.
``list`` shows them and asks each whether it answers (NodeGetInfo, as registration does);
``forget`` removes one (a driver that moved or was uninstalled), under the root's lock.
Named after the flag that adds them.
"""

from __future__ import annotations

import argparse
import sys

from kubevol.cli.node_common import require_root, root_lock
from kubevol.cli.output import Table, add_output_flags, columns, emit
from kubevol.cli.parser import DEFAULT_ROOT, DURATION, ROOT_ENV, default_root
from kubevol.errors import KubevolError
from kubevol.util.deadline import Deadline

TABLE = Table(columns=columns("name", "endpoint", "state", "node_id"), name="name")


def run_list(args: argparse.Namespace) -> int:
    from kubevol.node.runtime import ASSUMED_CSI_VERSIONS, DriverEndpoints
    from kubevol.plugins.csi.registration import DriverRegistry

    root = require_root(args)
    known = DriverEndpoints(root).load()
    rows: list[dict[str, object]] = []
    deadline = Deadline.after(args.timeout)
    registry = DriverRegistry(client_timeout=args.timeout)
    try:
        for name, endpoint in sorted(known.items()):
            row: dict[str, object] = {"name": name, "endpoint": endpoint, "node_id": None}
            registry.node_info_timeout = deadline.cap(args.timeout)
            try:
                driver = registry.register_driver(name, endpoint, ASSUMED_CSI_VERSIONS)
            except KubevolError as exc:
                row["state"] = "not answering"
                row["error"] = str(exc)
            else:
                row["state"] = "answering"
                row["node_id"] = driver.node_info.node_id
            rows.append(row)
    finally:
        registry.close()
    emit(rows, TABLE, args, sys.stdout)
    return 0


def run_forget(args: argparse.Namespace) -> int:
    from kubevol.node.runtime import DriverEndpoints

    root = require_root(args)
    with root_lock(args, Deadline.after(args.timeout)):
        endpoints = DriverEndpoints(root)
        for name in args.names:
            endpoint = endpoints.forget(name)
            print(f"{name}: forgotten (was {endpoint})")
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    verbs = parser.add_subparsers(dest="drivers_command", metavar="COMMAND", required=True)
    listing = verbs.add_parser("list", help="the remembered drivers, and whether each answers",
                               description="The remembered drivers (NAME, ENDPOINT) and "
                               "whether each answers NodeGetInfo now (STATE, NODE ID).")
    forget = verbs.add_parser("forget", help="forget remembered drivers by name",
                              description="Remove drivers from the root's list (exit 1 when "
                              "one is not on it). Mounted volumes are not touched.")
    forget.add_argument("names", nargs="+", metavar="NAME", help="a driver's name")
    for sub in (listing, forget):
        sub.add_argument("--root", default=default_root(), metavar="DIR",
                         help=f"the kubelet-style root (default: ${ROOT_ENV}, else "
                         f"{DEFAULT_ROOT})")
        sub.add_argument("--timeout", type=DURATION, default=10.0,
                         help="how long to wait for each driver (list) or the root's lock "
                         "(forget): a Go duration or seconds (default: 10s)")
    add_output_flags(listing)
    listing.set_defaults(func=run_list)
    forget.set_defaults(func=run_forget)
