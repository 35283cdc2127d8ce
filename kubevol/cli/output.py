"""Rendering command results as a table, JSON or YAML, the same way for every command."""

from __future__ import annotations

import argparse
import datetime
import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import yaml

FORMATS = ("table", "json", "yaml")


def add_output_flag(
    parser: argparse.ArgumentParser, formats: Sequence[str] = FORMATS, default: str = "table"
) -> None:
    """Add ``-o/--output`` with the given formats."""
    parser.add_argument(
        "-o",
        "--output",
        choices=list(formats),
        default=default,
        help=f"output format (default: {default})",
    )


def to_plain(value: Any) -> Any:
    """Turn enums, datetimes and nested containers into JSON/YAML-friendly values."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def render(
    data: Any,
    fmt: str,
    out: TextIO,
    *,
    rows: Sequence[Mapping[str, Any]] | None = None,
    columns: Sequence[str] = (),
) -> None:
    """Write ``data`` as JSON or YAML, or ``rows`` (default: ``data``) as a table of ``columns``."""
    if fmt == "json":
        json.dump(to_plain(data), out, indent=2, sort_keys=False)
        out.write("\n")
        return
    if fmt == "yaml":
        yaml.safe_dump(to_plain(data), out, sort_keys=False)
        return
    table_rows = rows if rows is not None else data
    write_table(table_rows, columns, out)


def write_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    """Write ``rows`` as aligned columns with an upper-case header."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    header = [c.upper().replace("_", " ") for c in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    for line in [header, *cells]:
        out.write("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    return str(to_plain(value))
