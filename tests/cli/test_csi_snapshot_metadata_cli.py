"""Covers kubevol.cli.csi.snapshot_metadata.

``kubevol csi snapshot-metadata allocated|delta``: the streamed SnapshotMetadata RPCs,
against the mock driver serving them over a real unix socket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver
from tests.csi.support import ServeFactory

MiB = 1 << 20


class CLI:
    """Runs ``kubevol ARGS --endpoint E`` in-process: (exit code, stdout, stderr)."""

    def __init__(self, capsys: pytest.CaptureFixture[str], endpoint: str) -> None:
        self.capsys = capsys
        self.endpoint = endpoint

    def run(self, *args: str) -> tuple[int, str, str]:
        code = main([*args, "--endpoint", self.endpoint])
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *args: str) -> str:
        """stdout of a command that must succeed."""
        code, out, err = self.run(*args)
        assert code == 0, err
        return out


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Iterator[CLI]:
    """The CLI pointed at a mock that serves SnapshotMetadata."""
    services = MockConfig().plugin_services | {t.PluginServiceType.SNAPSHOT_METADATA_SERVICE}
    with MockDriver(MockConfig(node_id="node-1", plugin_services=services)).serve() as running:
        yield CLI(capsys, running.endpoint)


def snapshots(cli: CLI) -> tuple[str, str]:
    """Two snapshots of one 8 MiB block volume."""
    vid = cli.ok("csi", "controller", "create-volume", "v", "--cap", "1,block",
                 "--req-bytes", "8Mi", "-o", "name").strip()  # fmt: skip
    s1 = cli.ok("csi", "controller", "create-snapshot", "s1", "--source-volume", vid, "-o", "name")
    s2 = cli.ok("csi", "controller", "create-snapshot", "s2", "--source-volume", vid, "-o", "name")
    return s1.strip(), s2.strip()


def json_lines(text: str) -> list[Any]:
    """One JSON object per line, each on a single line."""
    return [json.loads(line) for line in text.splitlines()]


def test_allocated_json_is_one_object_per_streamed_message(cli: CLI) -> None:
    """``-o json`` prints each streamed message as one compact JSON object on its own line;
    ``--max-results`` splits the stream, ``--starting-offset`` resumes it."""
    s1, _ = snapshots(cli)
    lines = json_lines(cli.ok("csi", "snapshot-metadata", "allocated", s1,
                              "--max-results", "3", "-o", "json"))  # fmt: skip
    assert [len(m["block_metadata"]) for m in lines] == [3, 1]
    assert lines[0] == {
        "block_metadata_type": "FIXED_LENGTH",
        "volume_capacity_bytes": 8 * MiB,
        "block_metadata": [
            {"byte_offset": 0, "size_bytes": MiB},
            {"byte_offset": 2 * MiB, "size_bytes": MiB},
            {"byte_offset": 4 * MiB, "size_bytes": MiB},
        ],
    }
    resumed = json_lines(cli.ok("csi", "snapshot-metadata", "allocated", s1,
                                "--starting-offset", str(5 * MiB), "-o", "json"))  # fmt: skip
    assert [b["byte_offset"] for m in resumed for b in m["block_metadata"]] == [6 * MiB]


def test_delta_in_every_format(cli: CLI) -> None:
    """delta prints the changed ranges: a table row per range (type and volume size in
    ``wide``), a YAML document per message, the offsets with ``name`` and ``jsonpath``."""
    s1, s2 = snapshots(cli)
    cmd = ("csi", "snapshot-metadata", "delta", s1, s2)
    assert cli.ok(*cmd).splitlines() == [
        "OFFSET   SIZE",
        "0        1.0 MiB",
        "4194304  1.0 MiB",
    ]
    wide = cli.ok(*cmd, "-o", "wide", "--max-results", "1").splitlines()
    assert wide[0].split() == ["OFFSET", "SIZE", "TYPE", "VOLUME", "SIZE"]
    assert [line.split() for line in wide[1:]] == [
        ["0", "1.0", "MiB", "FIXED_LENGTH", "8.0", "MiB"],
        ["4194304", "1.0", "MiB", "FIXED_LENGTH", "8.0", "MiB"],
    ]
    docs = list(yaml.safe_load_all(cli.ok(*cmd, "-o", "yaml", "--max-results", "1")))
    assert [d["block_metadata"] for d in docs] == [
        [{"byte_offset": 0, "size_bytes": MiB}],
        [{"byte_offset": 4 * MiB, "size_bytes": MiB}],
    ]
    assert cli.ok(*cmd, "-o", "name").split() == ["0", str(4 * MiB)]
    path = "jsonpath={.block_metadata[*].byte_offset}"
    assert cli.ok(*cmd, "-o", path).split() == ["0", str(4 * MiB)]
    first_row = cli.ok(*cmd, "-o", "table", "--no-headers").splitlines()[0]
    assert first_row.split() == ["0", "1.0", "MiB"]


def test_driver_errors_exit_with_their_code(cli: CLI) -> None:
    """An unknown snapshot exits 5 (NOT_FOUND), an offset past the end 11 (OUT_OF_RANGE),
    each naming the command and the driver's message; nothing is printed on stdout."""
    s1, _ = snapshots(cli)
    code, out, err = cli.run("csi", "snapshot-metadata", "allocated", "nope", "-o", "json")
    assert (code, out) == (5, "")
    assert "kubevol csi snapshot-metadata allocated: NOT_FOUND: snapshot nope" in err
    code, out, err = cli.run("csi", "snapshot-metadata", "delta", s1, s1,
                             "--starting-offset", str(8 * MiB))  # fmt: skip
    assert (code, out) == (11, "") and "OUT_OF_RANGE" in err


def test_usage_errors_exit_64(cli: CLI) -> None:
    """A missing snapshot id is a usage error."""
    with pytest.raises(SystemExit) as info:
        cli.run("csi", "snapshot-metadata", "delta", "only-one")
    assert info.value.code == exits.USAGE


def test_error_mid_stream_comes_after_what_arrived(
    serve_driver: ServeFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The messages that arrived before an error mid-stream are printed, then the error,
    and the exit code is its gRPC code (the test driver fails ``missing`` after a message)."""
    served = serve_driver()
    code = main(["csi", "snapshot-metadata", "allocated", "missing",
                 "--endpoint", served.handle.address, "-o", "json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 5
    assert [m["block_metadata"] for m in json_lines(out)] == [
        [{"byte_offset": 0, "size_bytes": 4096}]
    ]
    assert "NOT_FOUND: snapshot missing vanished" in err
