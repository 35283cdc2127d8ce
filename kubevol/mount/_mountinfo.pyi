"""Types of the C extension built from ``_mountinfo.c`` (see :mod:`kubevol.mount.mountinfo`)."""

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

def parse(data: bytes, cls: type[T], fallback: Callable[[str, int], T], /) -> list[T]:
    """Every entry of the mountinfo text ``data``, as ``cls`` instances, octal escapes of
    the root, mount point, fs type and source decoded as ``mountinfo.unescape`` does; lines
    that are not of the ordinary shape (malformed, odd numbers) go to
    ``fallback(line, lineno)``."""

def containing(data: bytes, paths: tuple[bytes, ...], /) -> list[tuple[int, int] | None]:
    """For each escaped path, the ``(start, stop)`` offsets of the last line whose mount point
    is the path or one of its ancestors, or None."""

def lines_with(data: bytes, needle: bytes, /) -> list[tuple[int, int]]:
    """The ``(start, stop)`` offsets of every line containing ``needle``, in order."""
