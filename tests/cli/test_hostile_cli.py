"""The node commands given hostile input (issue 20): each ends in one line on stderr and a
documented exit code, changes nothing it should not, and stays within bounded memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.test_safeyaml import BOMB

#: Address-space cap for commands given hostile input: a bomb that got through would need
#: gigabytes.
MEMORY_CAP = 1536 * 1024 * 1024


def run_kubevol(*argv: str, cap: int = MEMORY_CAP, timeout: float = 120
                ) -> subprocess.CompletedProcess[str]:
    """``kubevol ARGV`` in a child process with its address space capped."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", *argv], capture_output=True, text=True,
        timeout=timeout, preexec_fn=limit, check=False,
    )


def test_up_refuses_an_alias_bomb_in_bounded_memory(tmp_path: Path) -> None:
    """The 421-byte manifest that drove ``up`` to 3.9 GB: one line, exit 1, nothing recorded
    (issue 20, point 6)."""
    manifest = tmp_path / "bomb.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  bomb:\n"
        + "\n".join("    " + line for line in BOMB.splitlines()) + "\n"
    )
    root = tmp_path / "root"
    proc = run_kubevol("up", "--root", str(root), "--node-name", "n1", str(manifest))
    assert proc.returncode == 1, proc.stderr
    assert "excessive aliasing" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # the --root notice and the error
    assert "Traceback" not in proc.stderr
    assert not (root / "kubevol" / "pods").exists() or not os.listdir(root / "kubevol" / "pods")
