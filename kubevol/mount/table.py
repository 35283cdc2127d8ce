"""A snapshot of the mount table that answers lookups without parsing every line, and a
cache that re-reads the table only when the kernel says it changed.

A node with many pods has tens of thousands of mounts; parsing them all into objects for one
question ("who else mounts this filesystem?") costs more than the question. :class:`MountTable`
keeps the raw bytes and finds candidate lines with substring searches (done in C), parsing
only the lines it returns. Every candidate is parsed and checked field by field, so the
answers are exactly those of a full parse.

:class:`MountTableCache` keeps ``/proc/self/mountinfo`` open: the kernel flags
``POLLPRI | POLLERR`` on that descriptor when the namespace's mount table changes, so an
unchanged table is never read twice; and for checks that only refuse on what they find, a
table that only lost mounts since it was read is as good as a fresh one
(:mod:`kubevol.mount.mountwatch`).

How the table is read, and what a read of a changing table guarantees:
:mod:`kubevol.mount.mountread`.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence

from kubevol.errors import MountError, MountInfoError
from kubevol.layout import is_within
from kubevol.mount.mountinfo import (
    MountInfo,
    escape,
    parse_mountinfo_bytes,
    parse_mountinfo_line,
)
from kubevol.mount.mountread import PROC_MOUNTINFO, MountinfoReader
from kubevol.mount.mountwatch import AttachWatch
from kubevol.util import fdtree
from kubevol.util.lifecycle import ClosesOnExit

_native_containing: Callable[[bytes, tuple[bytes, ...]], list[tuple[int, int] | None]] | None
_native_lines_with: Callable[[bytes, bytes], list[tuple[int, int]]] | None
try:  # the C scans (_mountinfo.c); the substring and regex searches below are their twins
    from kubevol.mount._mountinfo import containing as _native_containing
    from kubevol.mount._mountinfo import lines_with as _native_lines_with
except ImportError:  # not built
    _native_containing = _native_lines_with = None


class MountTable:
    """An immutable snapshot of one mountinfo text.

    Lookups rely on one property of the kernel's format: the per-mount options (field 6)
    always start with ``rw`` or ``ro``. Text that breaks it still parses with
    :meth:`entries`; :meth:`find_containing` then falls back to a full scan.
    """

    __slots__ = ("_base", "_data", "_removed")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._base: MountTable | None = None
        self._removed: frozenset[str] = frozenset()

    @classmethod
    def from_text(cls, text: str) -> MountTable:
        """A table over ``text`` (as read from a mountinfo file)."""
        return cls(os.fsencode(text))

    @property
    def data(self) -> bytes:
        """The raw mountinfo bytes."""
        return self._data

    @property
    def derived_from(self) -> tuple[MountTable, frozenset[str]] | None:
        """The table this one was made from by :meth:`without_mount_points`, and the mount
        points it left out (None: read as it is)."""
        return None if self._base is None else (self._base, self._removed)

    def without_mount_points(self, points: Sequence[str]) -> MountTable:
        """This table without the entries mounted at ``points`` (absolute, normalised): the
        table as it is once those mount points are known to be gone. The cost grows with
        the lines that mention them."""
        data = self._data
        spans = []
        for point in set(points):
            escaped = os.fsencode(escape(point))
            spans += [(start, stop) for start, stop in self._spans_with(b" " + escaped + b" ")
                      if _mount_point_field(data, start, stop) == escaped]
        if not spans:
            return self
        parts, pos = [], 0
        for start, stop in sorted(spans):
            parts.append(data[pos:start])
            pos = stop + 1  # with its newline
        parts.append(data[pos:])
        table = MountTable(b"".join(parts))
        table._base, table._removed = self, frozenset(points)
        return table

    def entries(self) -> list[MountInfo]:
        """Every entry, in table order. Raises :class:`~kubevol.errors.MountInfoError`."""
        return parse_mountinfo_bytes(self._data)

    def find_mount_point(self, path: str) -> MountInfo | None:
        """The last (top-most) entry mounted exactly at ``path``, or None."""
        found = self._last_at(path, 0)
        return found[1] if found else None

    def find_containing(self, path: str) -> MountInfo | None:
        """The last entry whose mount point is ``path`` or one of its ancestors.

        This is the mount Kubernetes' ``SearchMountPoints`` picks with its reverse scan: the
        latest mount over the path wins, whatever its depth. ``path`` must be absolute and
        normalised.
        """
        return self.find_containing_all((path,))[0]

    def find_containing_all(self, paths: Sequence[str]) -> list[MountInfo | None]:
        """:meth:`find_containing` for each of ``paths``, in one pass over the table."""
        data = self._data
        if _native_containing is not None:
            spans = _native_containing(data, tuple(os.fsencode(escape(p)) for p in paths))
            found = [None if span is None else _parse(data, *span) for span in spans]
        else:
            found = [self._find_containing_by_search(p) for p in paths]
        return [
            entry if entry is not None else self._find_containing_by_parse(path)
            for path, entry in zip(paths, found, strict=True)
        ]

    def _find_containing_by_search(self, path: str) -> MountInfo | None:
        data = self._data
        found = self._last_at(path, 0)
        low, best = found if found else (0, None)
        if path != "/":
            # Only a line after the best one so far can win: one regex pass over the rest
            # finds every ancestor mount point at once.
            last: tuple[int, int] | None = None
            for match in _ancestors_pattern(path).finditer(data, low):
                start, stop = _line_bounds(data, match.start())
                if _mount_point_field(data, start, stop) == match.group(1):
                    last = (start, stop)
            if last is not None:
                best = _parse(data, *last)
        return best

    def _find_containing_by_parse(self, path: str) -> MountInfo | None:
        # Text not written by the kernel (options not starting with rw/ro, paths escaped
        # where the kernel would not): scan it all.
        candidates = set(_self_and_ancestors(path))
        matches = [e for e in self.entries() if e.mount_point in candidates]
        return matches[-1] if matches else None

    def mounted_under(self, path: str) -> list[MountInfo]:
        """Entries mounted at ``path`` or below it, in table order (``path`` absolute and
        normalised). The cost grows with the lines that mention the path."""
        prefix = path.rstrip("/") + "/"
        return [
            e
            for e in self._lines_with(b" " + os.fsencode(escape(path)))
            if e.mount_point == path or e.mount_point.startswith(prefix)
        ]

    def with_device(
        self, major: int, minor: int, root: str | None = None, *, under: bool = False
    ) -> list[MountInfo]:
        """Entries of device ``major:minor`` in table order.

        With ``root``, only entries whose root equals it, or, with ``under=True``, equals it
        or lies below it (a bind mount of a sub-directory). The cost grows with the lines
        that mention the device (and root), not with the table.
        """
        needle = f" {major}:{minor} ".encode()
        if root is not None:
            needle += os.fsencode(escape(root))
            if not under:
                needle += b" "
        out = []
        for entry in self._lines_with(needle):
            if entry.device != (major, minor):
                continue
            if root is None or entry.root == root or (under and is_within(entry.root, root)):
                out.append(entry)
        return out

    def _last_at(self, path: str, low: int) -> tuple[int, MountInfo] | None:
        """The last entry mounted at ``path`` on a line after offset ``low``, with the offset
        where its line ends."""
        data = self._data
        escaped = os.fsencode(escape(path))
        needle = b" " + escaped + b" r"
        end = len(data)
        while True:
            pos = data.rfind(needle, low, end)
            if pos < 0:
                return None
            start, stop = _line_bounds(data, pos)
            if _mount_point_field(data, start, stop) == escaped:
                return stop, _parse(data, start, stop)
            end = pos + len(needle) - 1

    def raw_lines_with(self, needle: bytes) -> list[bytes]:
        """The lines containing ``needle``, unparsed, each once, in table order (for a
        caller that keeps what it made of each line)."""
        data = self._data
        return [data[start:stop] for start, stop in self._spans_with(needle)]

    def _lines_with(self, needle: bytes) -> list[MountInfo]:
        """Parsed lines containing ``needle``, each once, in table order."""
        data = self._data
        return [_parse(data, start, stop) for start, stop in self._spans_with(needle)]

    def _spans_with(self, needle: bytes) -> list[tuple[int, int]]:
        """The bounds of the lines containing ``needle``, each once, in table order."""
        data = self._data
        if _native_lines_with is not None:
            return _native_lines_with(data, needle)
        # rfind is markedly faster than find in CPython for short needles; collect backwards.
        found = []
        end = len(data)
        while (pos := data.rfind(needle, 0, end)) >= 0:
            start, stop = _line_bounds(data, pos)
            found.append((start, stop))
            end = start
        found.reverse()
        return found


def _mount_point_field(data: bytes, start: int, stop: int) -> bytes | None:
    """The escaped mount point (field 5) of the line ``data[start:stop]``; None when the
    line has fewer than six fields."""
    fields = data[start:stop].split(b" ", 5)
    return fields[4] if len(fields) > 5 else None


def _line_bounds(data: bytes, pos: int) -> tuple[int, int]:
    start = data.rfind(b"\n", 0, pos) + 1
    stop = data.find(b"\n", pos)
    return start, (len(data) if stop < 0 else stop)


def _parse(data: bytes, start: int, stop: int) -> MountInfo:
    line = os.fsdecode(data[start:stop]).rstrip("\r")
    try:
        return parse_mountinfo_line(line, 0)
    except MountInfoError:
        # Counting lines is costly on a large table: only done to name a malformed one.
        return parse_mountinfo_line(line, data.count(b"\n", 0, start) + 1)


def _ancestors_pattern(path: str) -> re.Pattern[bytes]:
    """A regex matching `` <A> r`` for every proper ancestor A of ``path`` (``/`` included),
    with the mount point in group 1: `` (/(?:a(?:/b)?)?) r`` for ``/a/b/c``."""
    parts = [re.escape(os.fsencode(escape(p))) for p in path.strip("/").split("/")[:-1]]
    inner = b""
    for part in reversed(parts):
        inner = b"(?:/" + part + inner + b")?"
    body = inner[4:-2] if parts else b""  # the first component needs no leading "/"
    return re.compile(b" (/(?:" + body + b")?) r" if parts else b" (/) r")


def _self_and_ancestors(path: str) -> list[str]:
    out = [path]
    while path != "/":
        path = posixpath.dirname(path)
        out.append(path)
    return out


class MountTableCache(ClosesOnExit):
    """The current :class:`MountTable` of a mountinfo file, re-read only when it changed.

    For a proc file, the change signal is the kernel's poll flag; for a regular file (a
    fixture), its size, inode and modification time. Thread-safe: callers that ask while a
    read is under way share the next read rather than each reading (a read that began after
    a caller asked shows the table as it was then or later, all the caller can want); so
    workers checking a table that changes all the time read it about once per round, not
    once each. ``reads`` counts how often the file was actually read. Use as a context
    manager or call :meth:`close`.
    """

    def __init__(self, path: str = PROC_MOUNTINFO) -> None:
        self.path = path
        self.reads = 0
        self._lock = threading.Lock()
        self._reader: MountinfoReader | None = None
        self._table: MountTable | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._closer: weakref.finalize[[int], MountTableCache] | None = None
        #: Reads begun so far, and which of them gave the table held now.
        self._begun = 0
        self._held_from = 0
        #: Mount events (for ``superset`` callers), and whether the table held was read
        #: while they were watched.
        self._watch: AttachWatch | None = None
        self._watch_tried = False
        self._watched = False
        #: Mount points known gone since the table held was read (:meth:`removing`).
        self._gone: set[str] = set()

    def table(self, *, superset: bool = False, at: str | None = None) -> MountTable:
        """The table as it is now. Raises :class:`~kubevol.errors.MountError` if unreadable.

        ``superset=True`` accepts a table that may still list mounts detached since it was
        read (every mount present now is listed, at its place): a caller that counts each
        listed mount as a reason to refuse decides "go ahead" on it as on a fresh table,
        and asks again without ``superset`` before refusing. The table held is then kept
        while the kernel reports no mount attached or moved in this namespace
        (:mod:`kubevol.mount.mountwatch`), so a tree that only shrinks, as in a tear-down,
        is not read again for every check. Without mount events (before Linux 6.15, no
        ``CAP_SYS_ADMIN``, a mountinfo file other than this process's), the same as
        without ``superset``. One lookup is not monotone: which mount holds a path (a
        detached mount may still be listed over the one there now). A caller that asks it
        names the path in ``at``; a kept table is then given only if the mount it has
        holding ``at`` is the one the path is on now.
        """
        asked_after = self._begun  # reads begun before this call; an int read is atomic
        with self._lock:
            if self._table is not None and self._held_from > asked_after:
                return self._table  # read since this call began
            held = self._table
            # _superset_holds first: it starts the watch, whether a table is held or not.
            if superset and self._superset_holds() and held is not None:
                if self._gone:
                    held = self._table = held.without_mount_points(sorted(self._gone))
                    self._gone.clear()
                if at is None or _holds(held, at):
                    return held
            reader = self._open()
            if reader.is_proc:
                # Poll before reading: a change during the read leaves the flag set, so
                # the next call reads again instead of keeping a table that missed it.
                stale = reader.changed() or self._table is None
            else:
                stamp = self._file_stamp()
                stale = self._table is None or stamp != self._stamp
                if stale and self._stamp is not None and stamp[0] != self._stamp[0]:
                    # The fixture file was replaced: read the new inode.
                    self._close_reader()
                    reader = self._open()
                self._stamp = stamp
            if stale or self._table is None:
                # The change flag is consumed: a failed read must not leave the old table.
                self._table = None
                self._gone.clear()
                self._begun += 1
                if self._watch is not None:
                    self._watch.attached()  # what is queued now, the read will show
                self._watched = self._watch is not None
                self._table = MountTable(reader.read())
                self._held_from = self._begun
                self.reads += 1
            return self._table

    @contextlib.contextmanager
    def removing(self, path: str) -> Iterator[None]:
        """Around the removal of directory ``path`` (absolute, normalised): once it is
        removed, nothing is mounted there (a mount point cannot be removed), and the table
        held for ``superset`` callers, if read before, leaves out what it lists there. A
        driver's unmount is so known without reading the table again: the unstage that
        follows an unpublish finds no publish mount."""
        begun = self._begun  # a table read from now on may or may not list the path
        yield
        with self._lock:
            if self._table is not None and self._held_from <= begun:
                self._gone.add(path)

    def _superset_holds(self) -> bool:
        """Whether the table held (if any) lists every mount present now: it was read while
        mount events were watched and no mount was attached or moved since. Starts the
        watch on first use (a table held then was read before it and does not count)."""
        if self.path != PROC_MOUNTINFO:
            return False
        if self._watch is None:
            if not self._watch_tried:
                self._watch_tried = True
                self._watch = AttachWatch.open()
            return False
        return self._watched and not self._watch.attached()

    def close(self) -> None:
        """Close the descriptor; the next :meth:`table` call reopens it. Idempotent."""
        with self._lock:
            self._close_reader()
            self._table = None
            self._stamp = None
            if self._watch is not None:
                self._watch.close()
            self._watch = None
            self._watch_tried = self._watched = False

    def _close_reader(self) -> None:
        if self._reader is not None:
            if self._closer is not None:
                self._closer.detach()
            os.close(self._reader.fd)
        self._reader = None

    def _open(self) -> MountinfoReader:
        if self._reader is None:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise MountError(
                    exc.errno, f"cannot read mount table {self.path!r}: {exc.strerror}"
                ) from exc
            self._reader = MountinfoReader(fd, self.path)
            # A cache dropped without close() must not leak its descriptor.
            self._closer = weakref.finalize(self, os.close, fd)
        return self._reader

    def _file_stamp(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise MountError(
                exc.errno, f"cannot read mount table {self.path!r}: {exc.strerror}"
            ) from exc
        return (st.st_ino, st.st_size, st.st_mtime_ns)


def _holds(table: MountTable, path: str) -> bool:
    """Whether the mount ``table`` has holding ``path`` (the last one containing it) is the
    one the path is on now; True when the path cannot be opened (a check then decides
    without the table) or the kernel cannot tell."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        current = fdtree.mount_id(fd)
    except OSError:
        return True
    finally:
        os.close(fd)
    entry = table.find_containing(os.path.realpath(path))
    return current is None or (entry is not None and entry.id == current)
