"""Covers kubevol.cli.output.

The one output module: every format on every read command, the same fields in each,
one write per answer, and a quiet stop when the reader goes away."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from typing import Any

import pytest
import yaml

from kubevol.cli import exits, output
from kubevol.cli.main import build_parser, main
from kubevol.cli.output import Column, OutputFormat, Table, cell, parse_format, render
from kubevol.cli.parser import all_parsers


def output_parsers() -> list[argparse.ArgumentParser]:
    """Every (sub-)command that prints a result with ``-o``."""
    found = []
    for parser in all_parsers(build_parser()):
        flags = {s for a in parser._actions for s in a.option_strings}
        if "-o" in flags:
            found.append(parser)
    return found


def test_every_read_command_takes_every_format_and_no_headers() -> None:
    """Each command with -o accepts table, wide, json, yaml, name and jsonpath=, and
    --no-headers."""
    found = output_parsers()
    progs = {p.prog for p in found}
    for expected in ("kubevol plugins", "kubevol metrics", "kubevol status",
                     "kubevol reconstruct", "kubevol mount-refs",
                     "kubevol csi controller list-volumes", "kubevol csi node stats"):
        assert expected in progs
    for parser in found:
        action = next(a for a in parser._actions if "-o" in a.option_strings)
        assert action.type is parse_format, parser.prog
        assert "--no-headers" in {s for a in parser._actions for s in a.option_strings}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``kubevol ARGV``'s standard output; the command must succeed."""
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_formats_show_the_same_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """``kubevol plugins``: the table's columns are JSON fields; name, jsonpath and
    --no-headers read the same data."""
    data = json.loads(run(capsys, "plugins", "-o", "json"))
    names = [p["name"] for p in data]
    assert yaml.safe_load(run(capsys, "plugins", "-o", "yaml")) == data
    wide = run(capsys, "plugins", "-o", "wide").splitlines()
    assert wide[0].split()[:3] == ["NAME", "SOURCE", "CAPABILITIES"]
    assert [line.split()[0] for line in wide[1:]] == names
    assert run(capsys, "plugins", "-o", "name").split() == names
    assert run(capsys, "plugins", "-o", "jsonpath={[*].name}").split() == names
    assert run(capsys, "plugins", "-o", "jsonpath=$[0].source").strip() == data[0]["source"]
    table = run(capsys, "plugins", "--no-headers").splitlines()
    assert [line.split()[0] for line in table] == names


def test_bad_jsonpath_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A JSONPath that does not parse is refused before the command runs."""
    with pytest.raises(SystemExit) as info:
        main(["plugins", "-o", "jsonpath={[[}"])
    assert info.value.code == exits.USAGE
    assert "bad JSONPath" in capsys.readouterr().err


def test_tables_are_for_people_json_is_exact() -> None:
    """Sizes are human and maps k=v in tables only; JSON keeps the bytes and the map."""
    data = [{"id": "a", "size": 1536, "ctx": {"k": "v", "x": "y"}, "ok": True, "none": None}]
    table = Table(columns=(Column("id"), Column("size", size=True), Column("ctx"),
                           Column("ok"), Column("none")))
    out = io.StringIO()
    render(data, (table,), OutputFormat("table"), out)
    assert out.getvalue().splitlines()[1].split() == ["a", "1.5", "KiB", "k=v,x=y", "true", "-"]
    out = io.StringIO()
    render(data, (table,), OutputFormat("json"), out)
    assert json.loads(out.getvalue()) == data
    assert cell({"a": 1, "b": [1, 2]}) == "a=1,b=1,2"


class CountingStream(io.StringIO):
    """Counts ``write`` calls."""

    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["json", "yaml", "table", "name"])
def test_an_answer_is_written_in_one_call(kind: str) -> None:
    """10,000 records go out in one write (JSON used to be written token by token)."""
    records = [{"volume_id": f"v{i}", "capacity_bytes": i, "ctx": {"a": "b"}}
               for i in range(10_000)]  # fmt: skip
    out = CountingStream()
    render(records, (Table(columns=(Column("volume_id"),)),), OutputFormat(kind), out)
    assert out.writes == 1 and "v9999" in out.getvalue()


def test_yaml_uses_libyaml_when_pyyaml_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """YAML is emitted by CSafeDumper when available, identical to safe_dump's text."""
    used: list[Any] = []
    real_dump = yaml.dump

    def spy(data: Any, **kwargs: Any) -> Any:
        used.append(kwargs["Dumper"])
        return real_dump(data, **kwargs)

    monkeypatch.setattr(yaml, "dump", spy)
    data = {"b": [1, {"c": None}], "a": "x"}
    assert output.yaml_text(data) == yaml.safe_dump(data, sort_keys=False)
    assert used == [getattr(yaml, "CSafeDumper", yaml.SafeDumper)]


def test_a_reader_that_goes_away_stops_the_command_quietly() -> None:
    """``kubevol ... | head``: no traceback, exit 141 (as a tool killed by SIGPIPE)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubevol.cli.main", "plugins", "-o", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read()
    assert proc.wait() == exits.BROKEN_PIPE
    assert err == b""


def test_json_output_is_what_json_dumps_writes() -> None:
    """-o json writes exactly json.dumps(indent=2)'s bytes, whichever encoder wrote them:
    ASCII data, non-ASCII text (escaped), integers beyond 64 bits, enums, nested and empty
    containers."""
    import enum

    class Mode(enum.Enum):
        FS = "Filesystem"

    cases: list[Any] = [
        {"volumes": [{"path": "/a b", "size": 2**40, "ok": True, "none": None, "f": 1.5}]},
        {"name": "caf\u00e9 \u2028 <&>", "nested": {"x": [], "y": {}}},
        {"huge": 2**70, "neg": -(2**65)},
        [],
    ]
    for data in cases:
        assert output.json_text(output.to_plain(data)) == json.dumps(data, indent=2)
    plain = output.to_plain({"mode": Mode.FS, "tags": {"b", "a"}, 3: (1, 2)})
    assert plain == {"mode": "Filesystem", "tags": ["a", "b"], "3": [1, 2]}
    assert output.json_text(plain) == json.dumps(plain, indent=2)
