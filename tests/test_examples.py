"""The README's library example is ``examples/library.py``, shown verbatim, and it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.mount.mountinfo import parse_mountinfo

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "library.py"


def test_readme_shows_the_library_example_verbatim() -> None:
    """The README's Python block is the example file, character for character."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"```python\n{EXAMPLE.read_text(encoding='utf-8')}```\n" in readme


@pytest.mark.root
def test_library_example_runs_and_cleans_up() -> None:
    """The example mounts, measures and tears down, and leaves no mount behind."""
    before = {e.mount_point for e in parse_mountinfo()}
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                         check=True, cwd="/").stdout  # fmt: skip
    lines = out.splitlines()
    assert lines[0].startswith("kubernetes.io/empty-dir mounted scratch at ")
    assert lines[0].endswith(": True")
    assert int(lines[1].split()[1]) == 1 << 20
    assert lines[2].endswith("exists: False")
    assert {e.mount_point for e in parse_mountinfo()} == before
