"""Entry point of the ``kubevol`` command.

Every command is a module with a ``configure(parser)`` function that adds its arguments
and sets ``func`` (``Callable[[argparse.Namespace], int]``) as the handler; the handler's
return value is the exit code. :data:`COMMANDS` names each command with its one-line
summary, so that ``kubevol --help`` imports no command module and a command imports only
its own (a ``kubevol csi`` call never loads the node layer, a ``kubevol plugins`` call never
loads grpc).

Exit codes are listed in :mod:`kubevol.cli.exits`.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import NamedTuple

from kubevol.cli import exits
from kubevol.cli.kubernetes_package import load_parts_on_use
from kubevol.cli.logs import add_logging_flags, setup_logging
from kubevol.cli.parser import ArgumentParser, all_parsers, plain_text
from kubevol.errors import KubevolError


class CommandInfo(NamedTuple):
    """One ``kubevol`` command: its name, the module that configures it, its summary."""

    name: str
    module: str
    summary: str


COMMANDS: tuple[CommandInfo, ...] = (
    CommandInfo("plugins", "kubevol.cli.plugins", "list volume plugins and their capabilities"),
    CommandInfo(
        "metrics",
        "kubevol.cli.metrics",
        "measure a volume's usage (du, statfs or block device capacity)",
    ),
    CommandInfo(
        "mount-refs",
        "kubevol.cli.mount_refs",
        "explain whether a device (staging) mount path may be unmounted",
    ),
    CommandInfo("csi", "kubevol.cli.csi.command", "call any CSI driver's RPCs (csc for Python)"),
    CommandInfo("driver", "kubevol.cli.driver", "serve a bundled CSI driver (mock or hostpath)"),
    CommandInfo("nomad", "kubevol.cli.nomad", "Nomad-style CSI plugins: register, health, mount"),
    CommandInfo("up", "kubevol.cli.up", "mount the volumes of pods under a kubelet-style root"),
    CommandInfo(
        "down", "kubevol.cli.down", "tear down the volumes of pods under a kubelet-style root"
    ),
    CommandInfo(
        "status",
        "kubevol.cli.status",
        "list the volumes under a kubelet-style root with their state and usage",
    ),
    CommandInfo(
        "reconstruct",
        "kubevol.cli.reconstruct",
        "rebuild from disk what is mounted under a kubelet-style root",
    ),
    CommandInfo(
        "csi-drivers",
        "kubevol.cli.csi_drivers",
        "list or forget the CSI drivers remembered under a kubelet-style root",
    ),
    CommandInfo(
        "agent",
        "kubevol.cli.agent",
        "run as a node agent: keep the volumes of static pods mounted, serve metrics",
    ),
    CommandInfo(
        "demo",
        "kubevol.cli.demo",
        "the whole story on a throw-away root: mount, crash, reconstruct, tear down",
    ),
    CommandInfo(
        "completion",
        "kubevol.cli.completion",
        "print the shell completion script for bash, zsh or tcsh",
    ),
)

DESCRIPTION = """\
Do on any Linux node what the kubelet's volume subsystem does: find volume plugins,
mount and measure volumes, drive CSI drivers, rebuild state from disk."""


#: Options of the main parser that take a value as the next argument.
_GLOBAL_VALUE_OPTIONS = frozenset({"-v", "--v", "--log-format"})


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (its first argument that is neither an option nor the
    value of a main-parser option), if any."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _GLOBAL_VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def build_parser(argv: Sequence[str] | None = None) -> ArgumentParser:
    """The ``kubevol`` parser. Only the command ``argv`` names is configured (its module
    imported); with ``argv`` None, every command is."""
    parser = ArgumentParser(
        prog="kubevol",
        description=DESCRIPTION,
        epilog=exits.EPILOG,
        formatter_class=exits.HelpFormatter,
    )
    add_logging_flags(parser)
    parser.add_argument("--version", action=VersionAction,
                        help="print kubevol's version and git commit, and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = None if argv is None else chosen_command(argv)
    for info in COMMANDS:
        sub = subparsers.add_parser(info.name, help=info.summary, description=info.summary)
        if argv is None or info.name == wanted:
            importlib.import_module(info.module).configure(sub)
            sub.description = plain_text(sub.description or info.summary)
            # -v and --log-format after the command too, as kubectl takes its global flags.
            for below in all_parsers(sub):
                add_logging_flags(below, after_command=True)
    return parser


def version_text() -> str:
    """``kubevol VERSION (git commit SHA)``: the commit of the checkout, or the one the
    wheel recorded when it was built (:mod:`kubevol.util.buildinfo`)."""
    from kubevol._version import __version__
    from kubevol.util.buildinfo import git_commit

    return f"kubevol {__version__} (git commit {git_commit() or 'unknown'})"


class VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (computed only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, _option_string: str | None = None) -> None:
        print(version_text())
        parser.exit(exits.OK)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kubevol`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    code = _run(argv)
    if argv is None:  # the process is this command
        _exit_past_stuck_threads(code)
    return code


def _run(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # At exit the interpreter collects garbage over every object still alive (modules, the
    # kubernetes client's classes, a command's state), which a large `down` notices. Frozen
    # objects are skipped and the process's memory goes back to the
    # system anyway. Registered once however often main runs (tests call it in-process).
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    if argv is None:  # the process is this command (a program calling main keeps the
        load_parts_on_use()  # kubernetes package as its __init__ makes it)
    try:
        if argv is None:  # the process is this command (tests calling main keep their GC)
            gc.disable()
        try:
            args = build_parser(args_list).parse_args(args_list)
        finally:
            if argv is None:
                tune_gc_after_start_up()
        setup_logging(args.verbosity, args.log_format, daemon=getattr(args, "daemon", False))
        try:
            code: int = args.func(args)
        except BrokenPipeError:
            raise  # the reader went away: handled below, quietly
        except exits.UsageError as exc:
            print(f"kubevol {args.command}: {one_line(exc)}", file=sys.stderr)
            return exits.USAGE
        except (KubevolError, OSError) as exc:
            # Expected failures (bad input, a full disk, a state dir that is a file, a
            # driver that went away): the reason, in one line.
            print(f"kubevol {args.command}: {one_line(exc)}", file=sys.stderr)
            return exits.FAILED
        except Exception as exc:
            if os.environ.get(exits.DEBUG_ENV):
                raise
            print(
                f"kubevol {args.command}: internal error: {type(exc).__name__}: "
                f"{one_line(exc)} (set {exits.DEBUG_ENV}=1 for the traceback)",
                file=sys.stderr,
            )
            return exits.INTERNAL
        sys.stdout.flush()
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    except BrokenPipeError:
        return _reader_went_away()
    return code


def _exit_past_stuck_threads(code: int) -> None:
    """End the process at once when a worker thread is still running: an operation stuck
    in the kernel below a dead mount (left behind by the command's deadline) can be neither
    stopped nor joined, and the interpreter's exit would join it (thread pools' workers) for
    ever. The kernel ends the stuck thread with the process; output is flushed first."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def tune_gc_after_start_up() -> None:
    """Start-up (the command's imports) makes objects that live as long as the process:
    none of them is collected, and every later collection leaves them out (frozen). A
    command then allocates mostly objects that survive until it answers (a node's volumes):
    young collections every 50,000 allocations instead of 700 keep the full collections from
    walking them over and over."""
    gc.freeze()
    gc.set_threshold(50_000)
    gc.enable()


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line; an ``OSError`` says what failed and on which path."""
    if isinstance(exc, OSError) and not isinstance(exc, KubevolError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        text = f"{exc.strerror}{where}"
    else:
        text = str(exc) or type(exc).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _reader_went_away() -> int:
    """The reader of stdout closed it (``| head``): stop quietly. Further writes go to
    /dev/null so that the interpreter's own flush at exit does not complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return exits.BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
