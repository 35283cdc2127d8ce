"""Types of the optional C extension built from ``_duwalk.c`` (see :mod:`kubevol.metrics.walk`)."""

import os

def walk(path: str | bytes | os.PathLike[str], threads: int, /) -> tuple[int, int]:
    """Return ``(st_blocks total, inodes)`` of the tree at ``path``; raises ``OSError``."""
