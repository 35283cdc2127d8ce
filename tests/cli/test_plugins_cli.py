"""Covers kubevol.cli.plugins: ``kubevol plugins``."""

from __future__ import annotations

import json
import subprocess
import sys

from kubevol.cli import exits


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", *args], capture_output=True, text=True,
        check=False,
    )


def test_plugins_json_lists_builtins_with_capabilities() -> None:
    """JSON output lists both built-in plugins and what hostPath can do."""
    out = run("plugins", "-o", "json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["kubernetes.io/host-path"]["capabilities"] == [
        "persistent", "recyclable", "deletable", "provisionable",
    ]
    assert rows["kubernetes.io/empty-dir"]["source"] == "builtin"


def test_plugins_table_has_header_and_rows() -> None:
    """The table has a header and one row per plugin."""
    out = run("plugins")
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "CAPABILITIES"]
    assert any(line.startswith("kubernetes.io/empty-dir") for line in lines)


def test_bad_output_format_is_usage_error() -> None:
    """An unknown -o value exits 64 (usage) and names the choices."""
    out = run("plugins", "-o", "xml")
    assert out.returncode == exits.USAGE
    assert "is not an output format: use table, wide, json, yaml, name" in out.stderr
