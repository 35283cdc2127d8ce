"""``kubevol csi SERVICE COMMAND``: call any RPC of any CSI driver (csc, for Python).

Connection flags are accepted before the service or after the command: ``--endpoint``
(default ``$CSI_ENDPOINT``), ``--timeout`` (a Go duration: 30s, 1m30s), ``--metadata k=v``
(sent with every call), ``--secrets-file`` (else ``$X_CSI_SECRETS``; secrets are sent,
never printed), ``-l/--log-level``, ``--with-request-logging``, ``--with-response-logging``
(secrets redacted) and ``-o table|wide|json|yaml|name|jsonpath=EXPR`` (the streamed answers
of ``snapshot-metadata`` print as they arrive: ``-o json`` one object per line). csc's names work
too: ``new``/``ls``/``rm`` for create-volume, list-volumes, delete-volume, and
``--volume-src``/``--snapshot-src``. The exit code is the gRPC status code (0 on success)
and the status message goes to stderr; a usage error exits 64.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import TYPE_CHECKING

from kubevol._version import __version__
from kubevol.cli import exits
from kubevol.cli.csi.common import Command, Output, plain_data, write_stream
from kubevol.cli.csi.controller import CONTROLLER
from kubevol.cli.csi.group import GROUP
from kubevol.cli.csi.identity import IDENTITY
from kubevol.cli.csi.inputs import parse_key_values, secrets_from
from kubevol.cli.csi.node import NODE
from kubevol.cli.csi.snapshot_metadata import SNAPSHOT_METADATA
from kubevol.cli.output import add_output_flags, emit
from kubevol.cli.parser import DURATION

if TYPE_CHECKING:
    from kubevol.csi.rpclog import ClientInterceptor

#: Per-call timeout when none is given (csc's default).
DEFAULT_TIMEOUT = 60.0
#: The user agent this command sends (the drivers' fuller one would load the server
#: framework, which a client call does not need).
USER_AGENT = f"kubevol-csi/{__version__}"

#: csc's log levels (logrus names) and what each means here.
LOG_LEVELS = {
    "panic": 50,
    "fatal": 50,
    "error": 40,
    "warn": 30,
    "warning": 30,
    "info": 20,
    "debug": 10,
}

SERVICES: tuple[tuple[str, str, tuple[Command, ...]], ...] = (
    ("identity", "Identity RPCs", IDENTITY),
    ("controller", "Controller RPCs", CONTROLLER),
    ("node", "Node RPCs", NODE),
    ("group", "GroupController RPCs (volume group snapshots)", GROUP),
    (
        "snapshot-metadata",
        "SnapshotMetadata RPCs (alpha; streamed: block ranges of snapshots)",
        SNAPSHOT_METADATA,
    ),
)


def add_connection_flags(parser: argparse.ArgumentParser, *, leaf: bool) -> None:
    """The flags every command takes. On a command (``leaf``) they default to "not given",
    so that values set before the service name are kept."""

    def default(value: object) -> object:
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
    parser.add_argument(
        "-l",
        "--log-level",
        type=str.lower,
        choices=list(LOG_LEVELS),
        default=default("warn"),
        help="what kubevol logs on stderr (csc's levels; default: warn)",
    )
    parser.add_argument(
        "--with-request-logging",
        action="store_true",
        default=default(False),
        help="log every request sent (secrets redacted)",
    )
    parser.add_argument(
        "--with-response-logging",
        action="store_true",
        default=default(False),
        help="log every response or error received (secrets redacted)",
    )
    add_output_flags(parser, suppress=leaf)


def set_up_logging(args: argparse.Namespace) -> list[ClientInterceptor]:
    """Log on stderr at ``--log-level``; returns the client interceptors the request and
    response logging flags ask for (their lines are logged at INFO whatever the level)."""
    import logging

    logging.basicConfig(
        level=LOG_LEVELS[args.log_level],
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not (args.with_request_logging or args.with_response_logging):
        return []
    from kubevol.csi.rpclog import LOGGER_NAME, logging_interceptor

    logging.getLogger(LOGGER_NAME).setLevel(logging.INFO)
    return [
        logging_interceptor(
            requests=args.with_request_logging, responses=args.with_response_logging
        )
    ]


def run(command: Command, args: argparse.Namespace) -> int:
    """Connect, call, print; the exit code is the gRPC status code. A streamed answer is
    printed as it arrives, so an error mid-stream comes after the messages before it."""
    from kubevol.csi.client import CSIClient  # grpc loads here, once the command is known
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
            endpoint,
            timeout=args.timeout,
            user_agent=USER_AGENT,
            metadata=metadata,
            interceptors=set_up_logging(args),
        )
    except ValueError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return exits.USAGE
    try:
        output = command.handler(client, args, secrets)
        if not isinstance(output, Output):
            write_stream(output, args.output, sys.stdout, no_headers=args.no_headers)
    except CSIRPCError as exc:
        print(f"{where}: {exc.code.name}: {exc.message}", file=sys.stderr)
        code: int = exc.code.value[0]
        return code
    except ValueError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return exits.USAGE
    finally:
        client.close()
    if isinstance(output, Output):
        emit(plain_data(output.data), output.tables_for(args.output), args, sys.stdout)
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
                command.name,
                aliases=list(command.aliases),
                help=command.help,
                description=command.help,
                parents=[common],
            )
            command.add_args(sub)
            sub.set_defaults(func=functools.partial(run, command))
