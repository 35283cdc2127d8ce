"""Covers kubevol.cli.main's parser as scripts/make-man.py renders it into kubevol(1).

kubevol(1) (issue 32, item 7): generated from the parser by scripts/make-man.py, it renders
with man(1) and documents every command and the exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.cli.main import COMMANDS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make-man.py"


@pytest.mark.slow
def test_the_man_page_renders_with_every_command(tmp_path: Path) -> None:
    page = tmp_path / "kubevol.1"
    made = subprocess.run([sys.executable, str(SCRIPT), str(page)], capture_output=True,
                          text=True, check=False)
    assert made.returncode == 0, made.stderr
    shown = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True,
                           check=False, env={**os.environ, "MANWIDTH": "100"})
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    for info in COMMANDS:
        assert f"kubevol {info.name}" in text, info.name
    assert "64" in text and "usage error" in text
