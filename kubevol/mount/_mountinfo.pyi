"""Types of the C extension built from ``_mountinfo.c`` (see :mod:`kubevol.mount.mountinfo`)."""

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

def parse(data: bytes, cls: type[T], fallback: Callable[[str, int], T], /) -> list[T]:
    """Every entry of the mountinfo text ``data``, as ``cls`` instances; lines that are not
    of the ordinary shape go to ``fallback(line, lineno)``."""
