"""``kubevol csi SERVICE COMMAND``: call any RPC of any CSI driver (csc, for Python).

Connection flags are accepted before the service or after the command: ``--endpoint``
(default ``$CSI_ENDPOINT``), ``--timeout``, ``--metadata k=v`` (sent with every call),
``--secrets-file`` (else ``$X_CSI_SECRETS``; secrets are sent, never printed) and
``-o table|json|yaml``. The exit code is the gRPC status code (0 on success) and the
status message goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

from kubevol.cli import exits
from kubevol.cli.csi.common import Command
from kubevol.cli.csi.controller import CONTROLLER
from kubevol.cli.csi.group import GROUP
from kubevol.cli.csi.identity import IDENTITY
from kubevol.cli.csi.inputs import parse_key_values, secrets_from
from kubevol.cli.csi.node import NODE
from kubevol.cli.output import add_output_flags, emit
from kubevol.cli.parser import DURATION

#: Per-call timeout when none is given (csc's default).
DEFAULT_TIMEOUT = 60.0
#: The name in the user agent this command sends.
CLIENT_NAME = "kubevol-csi"

SERVICES: tuple[tuple[str, str, tuple[Command, ...]], ...] = (
    ("identity", "Identity RPCs", IDENTITY),
    ("controller", "Controller RPCs", CONTROLLER),
    ("node", "Node RPCs", NODE),
    ("group", "GroupController RPCs (volume group snapshots)", GROUP),
)


def add_connection_flags(parser: argparse.ArgumentParser, *, leaf: bool) -> None:
    """The flags every command takes. On a command (``leaf``) they default to "not given",
    so that values set before the service name are kept."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if leaf else value

    parser.add_argument(
        "-e",
        "--endpoint",
        default=default(None),
        help="unix:///path.sock, a socket path or tcp://host:port (default: $CSI_ENDPOINT)",
    )
    parser.add_argument(
        "-t",
        "--timeout",
        type=DURATION,
        default=default(DEFAULT_TIMEOUT),
        help="per-call timeout, e.g. 30s or 2m (default: 1m)",
    )
    parser.add_argument(
        "-m",
        "--metadata",
        action="append",
        default=default([]),
        metavar="K=V[,K=V]",
        help="gRPC metadata sent with the call (repeatable)",
    )
    parser.add_argument(
        "--secrets-file",
        default=default(None),
        metavar="FILE",
        help="YAML/JSON secrets: a flat map, or csi-sanity's per-RPC sections "
        "(default: $X_CSI_SECRETS as K=V,K=V)",
    )
    add_output_flags(parser, suppress=leaf)


def run(command: Command, args: argparse.Namespace) -> int:
    """Connect, call, print; the exit code is the gRPC status code."""
    from kubevol.csi.client import CSIClient  # grpc loads here, once the command is known
    from kubevol.csi.drivers.common import user_agent
    from kubevol.csi.errors import CSIRPCError

    where = f"kubevol csi {args.csi_service} {command.name}"
    endpoint = args.endpoint or os.environ.get("CSI_ENDPOINT", "")
    if not endpoint:
        print(f"{where}: no endpoint: use --endpoint or set CSI_ENDPOINT", file=sys.stderr)
        return exits.USAGE
    try:
        secrets = secrets_from(args.secrets_file, os.environ)
        metadata = parse_key_values(args.metadata, "metadata")
        client = CSIClient(
            endpoint, timeout=args.timeout, user_agent=user_agent(CLIENT_NAME), metadata=metadata
        )
    except ValueError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return exits.USAGE
    try:
        output = command.handler(client, args, secrets)
    except CSIRPCError as exc:
        print(f"{where}: {exc.code.name}: {exc.message}", file=sys.stderr)
        code: int = exc.code.value[0]
        return code
    except ValueError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return exits.USAGE
    finally:
        client.close()
    emit(output.data, output.tables, args, sys.stdout)
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    """Configure ``kubevol csi`` and its SERVICE COMMAND tree."""
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_connection_flags(parser, leaf=False)
    common = argparse.ArgumentParser(add_help=False)
    add_connection_flags(common, leaf=True)
    services = parser.add_subparsers(dest="csi_service", metavar="SERVICE", required=True)
    for name, help_text, commands in SERVICES:
        service = services.add_parser(name, help=help_text, description=help_text)
        verbs = service.add_subparsers(dest="csi_command", metavar="COMMAND", required=True)
        for command in commands:
            sub = verbs.add_parser(
                command.name, help=command.help, description=command.help, parents=[common]
            )
            command.add_args(sub)
            sub.set_defaults(func=functools.partial(run, command))
