"""The argument parser every ``kubevol`` command uses: no abbreviated flags, usage errors
exit with :data:`kubevol.cli.exits.USAGE`, help text free of reStructuredText markup."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

from kubevol.cli import exits
from kubevol.util.units import duration_seconds, quantity_bytes

T = TypeVar("T")

#: The kubelet's root directory, the default of ``--root``.
DEFAULT_ROOT = "/var/lib/kubelet"
#: The environment variable that overrides :data:`DEFAULT_ROOT`.
ROOT_ENV = "KUBEVOL_ROOT"


def default_root() -> str:
    """``$KUBEVOL_ROOT`` if set, else the kubelet's ``/var/lib/kubelet``."""
    return os.environ.get(ROOT_ENV) or DEFAULT_ROOT


_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`~?([^`]+)`")


def plain_text(text: str) -> str:
    """Docstring text for a terminal: ``:class:`~a.b.C``` becomes ``C``, ````x```` ``x``."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "").replace("\\\\", "\\")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with kubevol's rules: a flag must be spelled out
    (``--end=x`` is not ``--endpoint=x``), and a usage error exits 64, not 2 (which is
    gRPC's UNKNOWN). Sub-parsers are of the same class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(exits.USAGE, f"{self.prog}: error: {message}\n")


def arg_type(fn: Callable[[str], T], name: str) -> Callable[[str], T]:
    """``fn`` as an argparse ``type``: its ``ValueError`` becomes a usage error with its
    message, and ``name`` is what argparse calls the value."""

    def convert(text: str) -> T:
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


#: A Kubernetes quantity of bytes (``10Gi``, ``1.5Gi``, ``1073741824``).
SIZE = arg_type(quantity_bytes, "size")
#: A Go duration (``1m30s``, ``500ms``) or seconds, as seconds.
DURATION = arg_type(duration_seconds, "duration")


def all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every sub-parser below it (for checks over the whole command line)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from all_parsers(sub)
