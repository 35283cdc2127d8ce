"""Entry point of the ``kubevol`` command.

Each command module named in ``COMMAND_MODULES`` has a ``register(subparsers)`` function
that adds its parser and sets ``func`` (``Callable[[argparse.Namespace], int]``) as the
handler; the handler's return value is the exit code. Modules are imported only when the
command line is built, so each command's dependencies (grpc, kubernetes) load only when needed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kubevol.errors import KubevolError

COMMAND_MODULES: tuple[str, ...] = (
    "kubevol.cli.plugins",
    "kubevol.cli.metrics",
    "kubevol.cli.mount_refs",
    "kubevol.cli.csi",
    "kubevol.cli.driver",
    "kubevol.cli.up",
    "kubevol.cli.down",
    "kubevol.cli.status",
    "kubevol.cli.reconstruct",
    "kubevol.cli.demo",
)

#: Exit code for bad input (as argparse uses).
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The full ``kubevol`` parser with every command registered."""
    parser = argparse.ArgumentParser(
        prog="kubevol",
        description=(
            "Do on any Linux node what the kubelet's volume subsystem does: find volume "
            "plugins, mount and measure volumes, drive CSI drivers, rebuild state from disk."
        ),
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kubevol`` with ``argv``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KubevolError as exc:
        print(f"kubevol {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
