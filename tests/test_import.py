"""Importing kubevol stays light."""

from __future__ import annotations

import subprocess
import sys


def test_import_kubevol_does_not_import_kubernetes() -> None:
    """`import kubevol` loads no kubernetes (or grpc) module."""
    code = (
        "import sys, kubevol; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'grpc')]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
