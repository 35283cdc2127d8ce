"""The ``kubevol csi`` commands: one small function per RPC, and the flags each takes.

Each handler gets a :class:`~kubevol.csi.client.CSIClient`, the parsed arguments and the
secrets to send, and returns an :class:`Output`: the data for ``-o json|yaml`` and the rows
and columns of the table; or, for an RPC whose answer streams, a :class:`Stream` printed
message by message as the messages arrive (:func:`write_stream`).
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TextIO, TypeVar

import attrs

from kubevol.cli.csi.inputs import CAPABILITY, parse_capability, parse_key_values
from kubevol.cli.output import (
    JSONPATH,
    Column,
    OutputFormat,
    Table,
    cell,
    columns,
    lookup,
    render,
    to_plain,
    yaml_text,
)
from kubevol.cli.parser import SIZE
from kubevol.csi import types as t
from kubevol.csidriver.sanity.inputs import Secrets
from kubevol.util import jsontext

if TYPE_CHECKING:
    from kubevol.csi.client import CSIClient  # brings grpc: loaded by the command's run


#: An entry of a paged list answer.
_E = TypeVar("_E")


@attrs.frozen(kw_only=True)
class Output:
    """What a command prints: ``data`` in every format, and how its tables read it.
    ``names`` are the tables ``-o name`` reads, when they are not ``tables`` (a group
    snapshot shown one row per member is one object: its name is printed once)."""

    data: object
    tables: Sequence[Table]
    names: Sequence[Table] | None = None

    def tables_for(self, fmt: OutputFormat) -> Sequence[Table]:
        """The tables that format ``fmt`` reads."""
        return self.names if fmt.kind == "name" and self.names is not None else self.tables


_PLAIN = frozenset({str, int, float, bool, type(None)})


def plain_data(value: object) -> object:
    """``value`` as JSON/YAML values (see :func:`~kubevol.cli.output.to_plain`), every enum
    by its name as protobuf's JSON mapping writes it (``"BYTES"``, never ``1``), so that
    ``-o json``, ``-o yaml`` and ``-o jsonpath`` say what the table says."""
    cls = type(value)
    if cls in _PLAIN:  # most values: exact types first, as to_plain does
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if attrs.has(cls):
        return {a.name: plain_data(getattr(value, a.name)) for a in attrs.fields(cls)}
    if isinstance(value, Mapping):
        return {(k.name if isinstance(k, enum.Enum) else str(k)): plain_data(v)
                for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return [plain_data(v) for v in sorted(value)]
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    return to_plain(value)


@attrs.frozen(kw_only=True)
class Stream:
    """What a command whose RPC streams prints: each of ``messages`` as it arrives, its rows
    found at ``table.at``. ``widest`` gives, from the first message, a row whose cells are
    as wide as any later one's can be, so that the table's columns line up across messages
    without waiting for the last one."""

    messages: Iterable[object]
    table: Table
    widest: Callable[[object], object] = lambda message: {}


Handler = Callable[["CSIClient", argparse.Namespace, Secrets], Output | Stream]


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


def pages(fetch: Callable[[str], t.Page[_E]], args: argparse.Namespace) -> Iterator[_E]:
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


def done(**fields: object) -> Output:
    """A one-row result of an RPC with an empty response."""
    return Output(data=fields, tables=table(*fields))


def caps_output(caps: frozenset[enum.IntEnum]) -> Output:
    """A capability set, one name per row."""
    names = [c.name for c in sorted(caps)]
    return Output(data=names, tables=table(Column("", header="CAPABILITY")))


def write_stream(stream: Stream, fmt: OutputFormat, out: TextIO, *, no_headers: bool) -> None:
    """Print ``stream``'s messages as they arrive, flushing after each: ``-o json`` one
    compact JSON object per message and line (JSON Lines), ``yaml`` one document per
    message, ``table``/``wide`` rows under one header, ``name`` the name of each row and
    ``jsonpath`` the values selected in each message. An error of the RPC surfaces from
    here, after what came before it was printed."""
    widths: list[int] = []
    shown = [c for c in stream.table.columns if fmt.kind == "wide" or not c.wide]
    header = [c.title for c in shown]
    for message in stream.messages:
        plain = plain_data(message)
        if fmt.kind == "json":
            text = jsontext.dumps(plain) + "\n"
        elif fmt.kind == "yaml":
            text = "---\n" + yaml_text(plain)
        elif fmt.kind == JSONPATH:
            render(plain, (stream.table,), fmt, out)
            out.flush()
            continue
        elif fmt.kind == "name":
            path = stream.table.name or stream.table.columns[0].path
            text = "".join(f"{cell(lookup(r, path))}\n" for r in _stream_rows(plain, stream))
        else:
            rows = [[_stream_cell(r, c) for c in shown] for r in _stream_rows(plain, stream)]
            if not widths:
                widest = [_stream_cell(plain_data(stream.widest(plain)), c) for c in shown]
                widths = [max(len(h), len(w)) for h, w in zip(header, widest, strict=True)]
                if not no_headers:
                    rows.insert(0, header)
            text = "".join(
                "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n"
                for row in rows
            )
        out.write(text)
        out.flush()


def _stream_rows(plain: object, stream: Stream) -> list[object]:
    """The rows of one message: the records at ``table.at``, one per element of the
    ``explode`` list when the table has one (a message without elements has no rows)."""
    table = stream.table
    found = lookup(plain, table.at)
    records = list(found) if isinstance(found, list) else [] if found is None else [found]
    if not table.explode:
        return records
    return [
        {**r, table.explode: e}
        for r in records
        if isinstance(r, Mapping)
        for e in r.get(table.explode) or []
    ]


def _stream_cell(record: object, column: Column) -> str:
    value = lookup(record, column.path)
    return column.show(value) if column.show is not None else cell(value, size=column.size)
