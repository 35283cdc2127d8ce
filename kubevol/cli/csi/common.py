"""The ``kubevol csi`` commands: one small function per RPC, and the flags each takes.

Each handler gets a :class:`~kubevol.csi.client.CSIClient`, the parsed arguments and the
secrets to send, and returns an :class:`Output`: the data for ``-o json|yaml`` and the rows
and columns of the table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kubevol.cli.csi.inputs import CAPABILITY, parse_capability, parse_key_values
from kubevol.cli.output import Column, Table, columns
from kubevol.cli.parser import SIZE
from kubevol.csi import types as t
from kubevol.csidriver.sanity.inputs import Secrets

if TYPE_CHECKING:
    from kubevol.csi.client import CSIClient  # brings grpc: loaded by the command's run


@attrs.frozen(kw_only=True)
class Output:
    """What a command prints: ``data`` in every format, and how its tables read it."""

    data: Any
    tables: Sequence[Table]


Handler = Callable[["CSIClient", argparse.Namespace, Secrets], Output]


@attrs.frozen(kw_only=True)
class Command:
    """One ``kubevol csi SERVICE NAME`` command."""

    name: str
    help: str
    handler: Handler
    add_args: Callable[[argparse.ArgumentParser], None] = lambda p: None
    #: Other names, as csc has them (``new`` for ``create-volume``, ...).
    aliases: tuple[str, ...] = ()


# --- argument helpers -----------------------------------------------------------------


DEFAULT_CAP = "SINGLE_NODE_WRITER,mount"


def add_caps(parser: argparse.ArgumentParser, *, single: bool = False) -> None:
    """``--cap MODE,TYPE[,FS[,FLAGS]]`` (repeatable unless ``single``)."""
    parser.add_argument(
        "--cap",
        dest="caps",
        action="append",
        type=CAPABILITY,
        metavar="MODE,TYPE[,FS[,FLAGS]]",
        help=(
            "volume capability: access mode name or number, mount|block (or 2|1), then "
            f"filesystem type and mount flags (default: {DEFAULT_CAP})"
            + ("" if single else "; repeatable")
        ),
    )


def caps_of(args: argparse.Namespace) -> list[t.VolumeCapability]:
    """The ``--cap`` values, or the default capability."""
    return list(args.caps or [parse_capability(DEFAULT_CAP)])


def add_map(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    """A repeatable ``--flag k=v[,k=v]`` option collected into a list of strings."""
    parser.add_argument(flag, action="append", default=[], metavar="K=V[,K=V]", help=what)


def map_of(items: list[str], what: str) -> dict[str, str]:
    """The ``k=v`` items of a map option; ``ValueError`` on a malformed one."""
    return parse_key_values(items, what)


def add_range(parser: argparse.ArgumentParser) -> None:
    """``--req-bytes`` and ``--lim-bytes`` (Kubernetes quantities like 10Gi, 1.5Gi)."""
    parser.add_argument("--req-bytes", type=SIZE, default=0, help="required size (e.g. 10Gi)")
    parser.add_argument("--lim-bytes", type=SIZE, default=0, help="size limit (e.g. 20Gi)")


def range_of(args: argparse.Namespace) -> t.CapacityRange | None:
    """The capacity range, or None when neither bound was given."""
    if not args.req_bytes and not args.lim_bytes:
        return None
    return t.CapacityRange(required_bytes=args.req_bytes, limit_bytes=args.lim_bytes)


def add_paging(parser: argparse.ArgumentParser) -> None:
    """``--max-entries``, ``--starting-token`` and ``--paging`` (follow every page)."""
    parser.add_argument("--max-entries", type=int, default=0, help="entries per page")
    parser.add_argument("--starting-token", default="", help="token of the page to start at")
    parser.add_argument(
        "--paging", action="store_true", help="follow next tokens until the last page"
    )


def pages(fetch: Callable[[str], t.Page[Any]], args: argparse.Namespace) -> Iterator[Any]:
    """Entries of the first page, or of every page with ``--paging``."""
    token = args.starting_token
    while True:
        page = fetch(token)
        yield from page.entries
        token = page.next_token
        if not args.paging or not token:
            return


def volume_columns(prefix: str = "") -> tuple[Column, ...]:
    """The columns of a volume record found at ``prefix`` in each row."""
    return (
        Column(prefix + "volume_id"),
        Column(prefix + "capacity_bytes", header="CAPACITY", size=True),
        Column(prefix + "volume_context", header="CONTEXT"),
        Column(prefix + "content_source", header="SOURCE"),
        Column(prefix + "accessible_topology", header="TOPOLOGY", wide=True),
    )


SNAPSHOT_COLUMNS = (
    Column("snapshot_id"),
    Column("source_volume_id"),
    Column("size_bytes", header="SIZE", size=True),
    Column("creation_time"),
    Column("ready_to_use", header="READY"),
)


def table(*specs: str | Column, at: str = "", name: str = "") -> tuple[Table]:
    """One table of these columns (paths or :class:`Column` s)."""
    return (Table(columns=columns(*specs), at=at, name=name),)


def done(**fields: Any) -> Output:
    """A one-row result of an RPC with an empty response."""
    return Output(data=fields, tables=table(*fields))


def caps_output(caps: frozenset[Any]) -> Output:
    """A capability set, one name per row."""
    names = [c.name for c in sorted(caps)]
    return Output(data=names, tables=table(Column("", header="CAPABILITY")))
