"""Reading metadata files that kubevol finds on disk, whoever wrote them.

kubevol's records, the CSI plugin's ``vol_data.json`` and the drivers' state files live
under roots that a crash, an operator or an attacker with write access may have changed. Such
a file may be a FIFO (an open for reading blocks until a writer comes: forever), a link to
``/dev/zero`` (a read never ends), hundreds of megabytes, or JSON nested 100,000 levels deep
(``RecursionError`` in the ``json`` module, or a crash in a C parser). So every read here
opens without following a link and without blocking, checks that it got a regular file,
reads at most a size cap, and parses JSON only once its nesting depth is known to be
bounded. Every refusal is an :class:`~kubevol.errors.UntrustedDataError` (a ``ValueError``)
naming the file: callers report one bad file as one bad volume or record, never fail a
whole command.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

from kubevol.errors import UntrustedDataError

#: The largest metadata file read (vol_data.json, records, state files): far above what
#: kubevol writes (a record holds a pod's manifests, which the API server caps at 3 MiB).
MAX_METADATA_BYTES = 4 * 1024 * 1024

#: The deepest JSON nesting accepted. kubevol's files nest a few levels; manifests a few
#: dozen. Well below what Python's recursive consumers (json, the kubernetes client's
#: deserializer, copying) survive.
MAX_JSON_DEPTH = 100

_CHUNK = 64 * 1024
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

#: JSON strings (skipped: brackets inside them do not nest) and brackets.
_JSON_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(
    path: str, *, max_bytes: int = MAX_METADATA_BYTES, dir_fd: int | None = None
) -> bytes:
    """The content of regular file ``path`` (relative to ``dir_fd`` when given).

    Opened with ``O_NOFOLLOW | O_NONBLOCK``: a link, a FIFO, a device or a directory is
    refused without blocking or reading, and so is a file over ``max_bytes``, with
    :class:`~kubevol.errors.UntrustedDataError`. ``FileNotFoundError`` passes through (callers
    tell "missing" apart); other ``OSError`` too.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedDataError(f"{path} is a symbolic link; refused") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedDataError(f"{path} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise UntrustedDataError(
                f"{path} holds {st.st_size} bytes, more than the {max_bytes} accepted"
            )
        # One read for the usual file: its size is known, and a short read of a regular
        # file is its end. A file that grew meanwhile (or whose size the filesystem does
        # not tell) is read on, up to one byte past the cap to tell that it is over.
        want = st.st_size + 1
        chunks = [os.read(fd, want)]
        total = len(chunks[0])
        while total == want and total <= max_bytes:
            step = min(_CHUNK, max_bytes + 1 - total)
            chunks.append(os.read(fd, step))
            total += len(chunks[-1])
            want += step
        if total > max_bytes:
            raise UntrustedDataError(f"{path} holds more than the {max_bytes} bytes accepted")
        return b"".join(chunks)
    finally:
        os.close(fd)


def json_depth_exceeds(data: bytes, max_depth: int) -> bool:
    """Whether JSON text ``data`` nests deeper than ``max_depth`` (brackets in strings do
    not count). Cheap for the usual file: one count of brackets bounds the depth."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    depth = 0
    for match in _JSON_NESTING.finditer(data):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def parse_json(data: bytes, where: str, *, max_depth: int = MAX_JSON_DEPTH) -> object:
    """JSON ``data`` (UTF-8), nested at most ``max_depth`` deep; ``where`` names it in the
    :class:`~kubevol.errors.UntrustedDataError` raised for anything else."""
    if json_depth_exceeds(data, max_depth):
        raise UntrustedDataError(f"{where} nests deeper than {max_depth} levels; refused")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UntrustedDataError(f"{where} is not valid JSON: {exc}") from exc


def load_json_file(
    path: str,
    *,
    max_bytes: int = MAX_METADATA_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    dir_fd: int | None = None,
) -> object:
    """:func:`read_regular_file` then :func:`parse_json`: the JSON document in ``path``.

    Raises ``FileNotFoundError`` when it is missing, :class:`~kubevol.errors.UntrustedDataError`
    when it is refused or malformed, ``OSError`` when it cannot be read.
    """
    return parse_json(
        read_regular_file(path, max_bytes=max_bytes, dir_fd=dir_fd), path, max_depth=max_depth
    )
