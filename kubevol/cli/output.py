"""Printing what a command found, the same way for every read command.

A command hands :func:`emit` its result as plain data (dicts, lists, strings, numbers,
enums, datetimes) and describes its tables as :class:`Table` s whose :class:`Column` s are
paths *into that data*, so a table can only show fields that ``-o json`` shows too. The
formats (``-o``):

- ``table`` (default) and ``wide`` (more columns): aligned columns under a header
  (``--no-headers`` drops it); sizes in KiB/MiB/GiB, maps as ``k=v,k=v``, lists as
  ``a,b``, nothing as ``-``. Human forms appear in tables only.
- ``json`` and ``yaml``: the data itself, exact (bytes as integers), written in one call
  (libyaml's ``CSafeDumper`` when PyYAML has it).
- ``name``: the name of each record, one per line.
- ``jsonpath=TEMPLATE``: kubectl's template language over the JSON
  (:mod:`kubevol.cli.jsonpath`: ``{.a[*].b}`` space-joined, literal text,
  ``{range .items[*]}{.x}{"\\t"}{end}``; a bare ``$.a[*].b`` is one expression), ended by
  a newline when the template's text does not end with one (kubectl adds none).

When the reader of the output goes away (``| head``) the command stops quietly: see
:func:`kubevol.cli.main.main`.
"""

from __future__ import annotations

import argparse
import datetime
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

import attrs

from kubevol.cli.jsonpath import Template, TemplateError, compile_template
from kubevol.errors import KubevolError
from kubevol.util import jsontext

#: The ``-o`` values (``jsonpath=EXPR`` besides).
FORMATS = ("table", "wide", "json", "yaml", "name")
JSONPATH = "jsonpath"


@attrs.frozen
class OutputFormat:
    """A parsed ``-o`` value: ``kind`` one of :data:`FORMATS` or ``jsonpath``."""

    kind: str
    expression: str = ""

    @property
    def tabular(self) -> bool:
        return self.kind in ("table", "wide")


def parse_format(text: str) -> OutputFormat:
    """``-o``'s value; a bad JSONPath is refused here, before the command does anything."""
    kind, sep, expression = text.partition("=")
    if kind == JSONPATH and sep:
        _compile_jsonpath(expression)
        return OutputFormat(kind=JSONPATH, expression=expression)
    if text in FORMATS:
        return OutputFormat(kind=text)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not an output format: use {', '.join(FORMATS)} or jsonpath=EXPR"
    )


parse_format.__name__ = "output format"  # what argparse calls the value in its messages


def add_output_flags(parser: argparse.ArgumentParser, *, default: str = "table",
                     suppress: bool = False) -> None:
    """``-o/--output`` and ``--no-headers``. With ``suppress`` the flags default to "not
    given", so that a value set on a parent parser is kept (``kubevol csi -o json ...``)."""
    parser.add_argument(
        "-o", "--output", type=parse_format,
        default=argparse.SUPPRESS if suppress else parse_format(default),
        metavar="FORMAT",
        help=f"{'|'.join(FORMATS)}|jsonpath=EXPR (default: {default})",
    )
    parser.add_argument(
        "--no-headers", action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="tables without their header line",
    )


@attrs.frozen
class Column:
    """One column: ``path`` into a record (``"volume.volume_id"``; ``""`` the record itself);
    the header defaults to the last part in capitals. ``size`` columns are bytes, shown as
    KiB/MiB/... in tables; ``wide`` columns appear only in ``-o wide``; ``show``, when given,
    turns the value into the cell's text (tables only)."""

    path: str
    header: str = ""
    size: bool = False
    wide: bool = False
    show: Callable[[object], str] | None = attrs.field(default=None, eq=False)

    @property
    def title(self) -> str:
        return self.header or self.path.rsplit(".", 1)[-1].upper().replace("_", " ")


@attrs.frozen
class Table:
    """Records shown as rows: found at ``at`` in the data (``""``: the data itself; a single
    mapping is one row). With ``explode``, a record gives one row per element of its list
    field ``explode`` (column paths below that field then read the element). ``name`` is the
    path ``-o name`` prints (default: the first column's). ``title`` is printed above the
    table when it has rows and is not the first."""

    columns: tuple[Column, ...]
    at: str = ""
    title: str = ""
    name: str = ""
    explode: str = ""


def columns(*specs: str | Column) -> tuple[Column, ...]:
    """Columns from paths (or ready :class:`Column` s)."""
    return tuple(c if isinstance(c, Column) else Column(c) for c in specs)


def emit(data: object, tables: Table | Sequence[Table], args: argparse.Namespace,
         out: TextIO) -> None:
    """Write ``data`` to ``out`` in the format ``args.output`` names (``args.no_headers``
    for tables)."""
    fmt: OutputFormat = getattr(args, "output", None) or OutputFormat("table")
    render(data, (tables,) if isinstance(tables, Table) else tuple(tables), fmt, out,
           no_headers=bool(getattr(args, "no_headers", False)))


def render(data: object, tables: Sequence[Table], fmt: OutputFormat, out: TextIO, *,
           no_headers: bool = False) -> None:
    """Write ``data`` to ``out`` as ``fmt`` says, in one ``write`` call."""
    plain = to_plain(data)
    if fmt.kind == "json":
        text = json_text(plain) + "\n"
    elif fmt.kind == "yaml":
        text = yaml_text(plain)
    elif fmt.kind == JSONPATH:
        text = _jsonpath_text(fmt.expression, plain)
    elif fmt.kind == "name":
        text = "".join(
            f"{_scalar(lookup(record, table.name or table.columns[0].path))}\n"
            for table in tables for record in _records(plain, table)
        )
    else:
        text = _tables_text(plain, tables, wide=fmt.kind == "wide", no_headers=no_headers)
    out.write(text)


def write_table(records: Sequence[object], specs: Sequence[str | Column], out: TextIO) -> None:
    """``records`` as a table of these columns (paths or :class:`Column` s) on ``out``."""
    render(records, (Table(columns=columns(*specs)),), OutputFormat("table"), out)


def yaml_text(data: object) -> str:
    """``data`` as block YAML, keys in their order; libyaml's emitter when available."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text: str = yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False,
                          allow_unicode=True)
    return text


def json_text(plain: object) -> str:
    """``plain`` (JSON values) as ``json.dumps(plain, indent=2)`` writes it, byte for byte
    (:func:`kubevol.util.jsontext.dumps`)."""
    return jsontext.dumps(plain, indent=True)


#: Values :func:`to_plain` keeps as they are, by exact type (subclasses, such as a
#: ``str`` enum, take the general way below).
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def to_plain(value: object) -> object:
    """Enums, datetimes, attrs instances and containers as JSON/YAML values (sets sorted)."""
    cls = type(value)
    # Exact types first: a command's data is mostly plain already (10,000 volumes are
    # 100,000 values), and these checks cost less than the isinstance chain.
    if cls in _PLAIN_TYPES:
        return value
    if type(value) is dict:
        return {k if type(k) is str else str(k): to_plain(v) for k, v in value.items()}
    if type(value) is list:
        return [to_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, enum.Enum):
        return to_plain(value.value)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if attrs.has(cls):
        return {a.name: to_plain(getattr(value, a.name)) for a in attrs.fields(cls)}
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return [to_plain(v) for v in sorted(value)]
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return str(value)


def lookup(record: object, path: str) -> object:
    """The value at dotted ``path`` in ``record``; None where any part is missing."""
    value = record
    for part in path.split(".") if path else ():
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def human_bytes(value: int | None) -> str:
    """``1536`` → ``1.5 KiB``; None → ``-``."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"  # pragma: no cover - the loop always returns


def cell(value: object, *, size: bool = False) -> str:
    """One table cell: human sizes, ``k=v`` maps, comma lists, ``-`` for nothing."""
    if value is None or value in ("", [], {}):
        return "-"
    if size and isinstance(value, int) and not isinstance(value, bool):
        return human_bytes(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(cell(v) for v in value)
    return str(value)


def _records(data: object, table: Table) -> list[object]:
    found = lookup(data, table.at)
    if found is None:
        return []
    return list(found) if isinstance(found, list) else [found]


def _rows(data: object, table: Table) -> list[object]:
    records = _records(data, table)
    if not table.explode:
        return records
    rows: list[object] = []
    for record in records:
        if not isinstance(record, Mapping):
            raise TypeError(f"{table.explode!r} is exploded in records that are not mappings")
        rows += ({**record, table.explode: element}
                 for element in (record.get(table.explode) or [None]))
    return rows


def _tables_text(data: object, tables: Sequence[Table], *, wide: bool, no_headers: bool) -> str:
    parts: list[str] = []
    for i, table in enumerate(tables):
        records = _rows(data, table)
        if i and not records:
            continue  # a later section (failures, orphans) with nothing in it
        if i and not no_headers:
            parts.append(f"\n{table.title}:\n" if table.title else "\n")
        shown = [c for c in table.columns if wide or not c.wide]
        rows = [[_cell_of(r, c) for c in shown] for r in records]
        parts.append(format_rows([c.title for c in shown], rows, no_headers=no_headers))
    return "".join(parts)


def _cell_of(record: object, column: Column) -> str:
    value = lookup(record, column.path)
    return column.show(value) if column.show is not None else cell(value, size=column.size)


def format_rows(header: Sequence[str], rows: Sequence[Sequence[str]], *,
                no_headers: bool = False) -> str:
    """Aligned columns, two spaces apart, trailing blanks trimmed."""
    lines = list(rows) if no_headers else [list(header), *rows]
    if not lines:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in lines
    )


def _scalar(value: object) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _compile_jsonpath(expression: str) -> Template:
    """kubectl's template ``expression``, compiled; raises ``ArgumentTypeError`` for a bad
    one (a usage error, before the command does anything)."""
    try:
        return compile_template(expression)
    except TemplateError as exc:
        raise argparse.ArgumentTypeError(f"bad JSONPath template {expression!r}: {exc}") from None


def _jsonpath_text(expression: str, plain: object) -> str:
    try:
        text = _compile_jsonpath(expression).execute(plain)
    except TemplateError as exc:
        raise KubevolError(f"-o jsonpath={expression}: {exc}") from exc
    return text if not text or text.endswith("\n") else text + "\n"
