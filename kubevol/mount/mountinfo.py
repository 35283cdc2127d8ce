"""Parsing ``/proc/<pid>/mountinfo`` (proc(5)) into :class:`MountInfo` entries.

One line reads::

    36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    (1)(2)(3)   (4)   (5)         (6)       (7)     (8)(9)  (10)      (11)

The kernel escapes space, tab, newline and backslash in paths and sources as three-digit
octal (``\\040`` ...); the parser decodes them. Any number of optional fields (7) may
precede the ``-`` separator.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import attrs

from kubevol.errors import MountInfoError
from kubevol.mount.mountread import PROC_MOUNTINFO, read_mountinfo_bytes

_native_parse: Callable[[bytes, type[MountInfo], Callable[[str, int], MountInfo]],
                        list[MountInfo]] | None
try:  # the C parser (_mountinfo.c); the pure-Python one below gives the same answers
    from kubevol.mount._mountinfo import parse as _native_parse
except ImportError:  # not built (a source tree without the extension)
    _native_parse = None

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")

#: Characters the kernel escapes in mountinfo (``show_mountinfo`` uses " \t\n\\").
_ESCAPES = (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012"))


@attrs.frozen(kw_only=True)
class MountInfo:
    """One line of a mountinfo file, with paths decoded."""

    id: int
    parent_id: int
    major: int
    minor: int
    #: The path inside the filesystem that is mounted here (``/`` for a whole filesystem,
    #: ``/sub`` for a bind mount of a sub-directory).
    root: str
    mount_point: str
    #: Per-mount options (``rw``, ``nosuid``, ...).
    options: tuple[str, ...]
    #: Propagation and other optional fields (``shared:1``, ``master:2``, ...).
    optional_fields: tuple[str, ...]
    fs_type: str
    source: str
    #: Per-superblock options.
    super_options: tuple[str, ...]

    @property
    def device(self) -> tuple[int, int]:
        """``(major, minor)`` of the filesystem."""
        return (self.major, self.minor)


def unescape(field: str) -> str:
    """Decode the kernel's octal escapes (``\\040`` is a space) in one field.

    Each backslash followed by three octal digits, left to right, becomes the character of
    that number (``chr``, up to ``\\777``); any other backslash stays. The C parser
    (``_mountinfo.c``) decodes exactly so.
    """
    if "\\" not in field:
        return field
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def escape(path: str) -> str:
    """Encode ``path`` the way the kernel writes it in mountinfo (inverse of :func:`unescape`)."""
    for raw, escaped in _ESCAPES:
        path = path.replace(raw, escaped)
    return path


def parse_mountinfo_line(line: str, lineno: int = 1) -> MountInfo:
    """Parse one mountinfo line (without its newline).

    Raises :class:`~kubevol.errors.MountInfoError` naming ``lineno`` and the line when the
    line does not have the mountinfo shape.
    """
    fields = line.split(" ")
    try:
        sep = fields.index("-", 6)
    except ValueError:
        raise _malformed(lineno, line, "no '-' separator after the 6th field") from None
    if len(fields) - sep - 1 != 3:
        raise _malformed(
            lineno, line, f"expected 3 fields after '-', got {len(fields) - sep - 1}"
        )
    major_s, colon, minor_s = fields[2].partition(":")
    try:
        if not colon:
            raise ValueError(fields[2])
        mount_id, parent_id = int(fields[0]), int(fields[1])
        major, minor = int(major_s), int(minor_s)
    except ValueError as exc:
        raise _malformed(lineno, line, "id, parent id or major:minor is not a number") from exc
    return MountInfo(
        id=mount_id,
        parent_id=parent_id,
        major=major,
        minor=minor,
        root=unescape(fields[3]),
        mount_point=unescape(fields[4]),
        options=tuple(fields[5].split(",")),
        optional_fields=tuple(fields[6:sep]),
        fs_type=unescape(fields[sep + 1]),
        source=unescape(fields[sep + 2]),
        super_options=tuple(fields[sep + 3].split(",")),
    )


def parse_mountinfo_text(text: str) -> list[MountInfo]:
    """Parse a whole mountinfo text; blank lines are skipped.

    Raises :class:`~kubevol.errors.MountInfoError` for the first malformed line.
    """
    return parse_mountinfo_bytes(os.fsencode(text))


def parse_mountinfo_bytes(data: bytes, *, native: bool | None = None) -> list[MountInfo]:
    """Parse a whole mountinfo text as read from the file (paths decoded like
    :func:`os.fsdecode`); blank lines are skipped.

    ``native`` picks the implementation: ``None`` uses the C parser when it is built,
    ``False`` forces the pure-Python one; both give the same entries and errors. Raises
    :class:`~kubevol.errors.MountInfoError` for the first malformed line.
    """
    if native is not False and _native_parse is not None:
        return _native_parse(data, MountInfo, parse_mountinfo_line)
    entries = []
    for lineno, raw in enumerate(os.fsdecode(data).split("\n"), start=1):
        line = raw.rstrip("\r")
        if line:
            entries.append(parse_mountinfo_line(line, lineno))
    return entries


def parse_mountinfo(path: str = PROC_MOUNTINFO) -> list[MountInfo]:
    """Read and parse the mountinfo file at ``path`` (default: this process's mount table).

    Raises :class:`~kubevol.errors.MountInfoError` for a malformed line and
    :class:`~kubevol.errors.MountError` when the file cannot be read.
    """
    return parse_mountinfo_bytes(read_mountinfo_bytes(path))


def _malformed(lineno: int, line: str, why: str) -> MountInfoError:
    return MountInfoError(f"malformed mountinfo line {lineno} ({why}): {line!r}")
