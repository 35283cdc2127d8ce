"""Covers kubevol.cli.parser and kubevol.cli.main.

The ``kubevol`` command line as a whole: lazy command loading, exact flag spelling,
usage errors distinct from gRPC codes, help text for terminals, durations and sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import COMMANDS, build_parser, main
from kubevol.cli.parser import all_parsers
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver


def loaded_modules(*argv: str) -> set[str]:
    """The modules a fresh interpreter has loaded after parsing (not running) ``argv``."""
    code = (
        "import sys, json\n"
        "from kubevol.cli.main import build_parser\n"
        f"build_parser({list(argv)!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return set(json.loads(out))


def test_help_loads_no_command_module() -> None:
    """``kubevol --help`` needs only the command table: no grpc, kubernetes or node layer."""
    mods = loaded_modules("--help")
    assert not {m.module for m in COMMANDS} & mods
    assert not {"grpc", "kubernetes", "kubevol.node", "kubevol.csi.client", "yaml"} & mods


def test_csi_command_parses_without_grpc_or_the_node_layer() -> None:
    """Building ``kubevol csi identity probe``'s parser loads neither grpc nor kubevol.node;
    grpc comes only when the call runs."""
    mods = loaded_modules("csi", "identity", "probe")
    assert "kubevol.cli.csi.command" in mods
    assert not {"grpc", "kubernetes", "kubevol.node", "kubevol.csidriver.server"} & mods


def test_help_text_has_no_restructuredtext_markup() -> None:
    """No help page of any command shows raw ``literals`` or :class:`roles`."""
    pages = [p.format_help() for p in all_parsers(build_parser())]
    assert len(pages) > 40
    for page in pages:
        assert "``" not in page and ":class:`" not in page and ":func:`" not in page, page


def test_every_command_is_in_the_table_and_configured() -> None:
    """Each command of the table has a parser with a handler."""
    parser = build_parser()
    for info in COMMANDS:
        with pytest.raises(SystemExit):  # required arguments or sub-commands are missing
            parser.parse_args([info.name, "--no-such-flag"])


@pytest.mark.parametrize(
    "argv",
    [
        ["csi", "identity", "probe", "--end=unix:///x.sock"],
        ["csi", "--timeo=1s", "identity", "probe"],
        ["plugins", "--out=json"],
        ["plugins", "-o", "json", "--no-header"],
    ],
)
def test_abbreviated_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A flag must be spelled out: ``--end=x`` is not taken for ``--endpoint=x``."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == exits.USAGE
    assert "unrecognized arguments" in capsys.readouterr().err


def test_usage_error_is_no_grpc_code() -> None:
    """The usage exit code is outside gRPC's 0-16 and documented in --help."""
    assert exits.USAGE > 16
    assert f"{exits.USAGE}" in build_parser([]).format_help()


@pytest.mark.parametrize(("text", "seconds"), [("1m30s", 90.0), ("500ms", 0.5), ("2", 2.0)])
def test_timeouts_take_go_durations(text: str, seconds: float) -> None:
    """``-t`` of ``kubevol csi`` and ``--timeout`` of the node commands read Go durations."""
    args = build_parser(["csi"]).parse_args(["csi", "-t", text, "identity", "probe"])
    assert args.timeout == seconds
    args = build_parser(["up"]).parse_args(["up", "--timeout", text])
    assert args.timeout == seconds


def test_sizes_take_kubernetes_quantities(capsys: pytest.CaptureFixture[str]) -> None:
    """``--req-bytes 1.5Gi`` creates a volume of 1.5 GiB."""
    with MockDriver(MockConfig(node_id="n")).serve() as running:
        code = main(["csi", "controller", "create-volume", "v", "--req-bytes", "1.5Gi",
                     "-e", running.endpoint, "-o", "json"])  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out)[0]["capacity_bytes"] == 3 << 29


def test_node_commands_default_to_kubevol_root_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --root, $KUBEVOL_ROOT is the root (else /var/lib/kubelet); the command
    names the root it used on stderr."""
    monkeypatch.setenv("KUBEVOL_ROOT", str(tmp_path))
    assert main(["status", "--no-metrics", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [] and f"root {tmp_path}" in err
    monkeypatch.delenv("KUBEVOL_ROOT")
    assert build_parser(["status"]).parse_args(["status"]).root == "/var/lib/kubelet"
