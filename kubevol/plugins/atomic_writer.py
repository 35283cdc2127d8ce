"""The kubelet's ``AtomicWriter``: projects a set of files into a directory so that readers
see either the whole old set or the whole new one (configMap, secret, downwardAPI and
projected volumes are written with it).

The directory a pod sees holds::

    ..2024_05_01_12_00_00.1234567890/   the data of one version (a timestamped dir)
    ..data -> ..2024_05_01_12_00_00.1234567890
    key    -> ..data/key                 one link per top-level name of the payload
    dir    -> ..data/dir                 (``dir/file`` is reached through ``dir``)

An update writes a new timestamped dir, points a ``..data_tmp`` link at it and renames
that over ``..data`` (``rename`` is atomic), then removes the links of names that left the
payload and the previous timestamped dir. Names starting with ``..`` are the writer's own,
so no payload path may start with ``..``. An unchanged payload rewrites nothing.

The writer is not thread-safe: callers serialise writes to one directory (the node layer
runs one operation per volume at a time).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import posixpath
import random
import re
import shutil
import stat
from collections.abc import Callable, Mapping

import attrs

from kubevol.errors import InvalidPayloadPathError

log = logging.getLogger(__name__)

#: The link readers follow to the current data (watch it with inotify to see updates).
DATA_DIR_NAME = "..data"
#: The link made beside ``..data`` and renamed over it.
NEW_DATA_DIR_NAME = "..data_tmp"
#: Longest payload path component, and whole payload path, in bytes (the kubelet's limits).
MAX_FILE_NAME_LENGTH = 255
MAX_PATH_LENGTH = 4096
#: Mode of file projections when the volume source gives none (the API's default).
DEFAULT_MODE = 0o644

#: ``..2006_01_02_15_04_05.<digits>``: the timestamped dirs this writer makes.
_TS_DIR = re.compile(r"^\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.\d+$")


@attrs.frozen(kw_only=True)
class FileProjection:
    """One file of a payload. ``data`` is never shown (it may be a secret or a token)."""

    data: bytes = attrs.field(repr=False)
    mode: int = DEFAULT_MODE
    #: Owner to give the file (``None``: the writer's own user).
    fs_user: int | None = None


#: Called with the name of the new timestamped dir once the payload is written there and
#: before it is published: the place to apply fsGroup ownership.
SetPerms = Callable[[str], None]


def validate_payload_path(path: str, key: str | None = None) -> str:
    """Return ``path`` cleaned (``a/./b`` → ``a/b``) if it may be a payload path, else raise
    :class:`~kubevol.errors.InvalidPayloadPathError` naming ``key`` (what the path came
    from; the path itself when None).

    Refused, as the kubelet refuses them: empty, absolute, longer than 4096 bytes, a
    ``..`` element or a component over 255 bytes, a first component starting with ``..``
    (the writer's own names). Also refused: NUL, and a path naming the volume root itself.
    """
    what = f"payload key {key!r}" if key is not None else "payload path"

    def bad(why: str) -> InvalidPayloadPathError:
        return InvalidPayloadPathError(f"invalid path {path!r} for {what}: {why}")

    if not isinstance(path, str):
        raise InvalidPayloadPathError(f"invalid path for {what}: not a string")
    if path == "":
        raise bad("must not be empty")
    if path.startswith("/"):
        raise bad("must be a relative path")
    if "\0" in path:
        raise bad("must not contain NUL")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_LENGTH:
        raise bad(f"must be at most {MAX_PATH_LENGTH} bytes long")
    items = path.split("/")
    for item in items:
        if item == "..":
            raise bad("must not contain '..'")
        if len(item.encode("utf-8", "surrogateescape")) > MAX_FILE_NAME_LENGTH:
            raise bad(f"file names must be at most {MAX_FILE_NAME_LENGTH} bytes long")
    if items[0].startswith("..") and len(items[0]) > 2:
        raise bad("must not start with '..'")
    cleaned = posixpath.normpath(path)
    if cleaned == ".":
        raise bad("names the volume directory itself")
    return cleaned


def validate_payload(payload: Mapping[str, FileProjection]) -> dict[str, FileProjection]:
    """Every path of ``payload`` validated and cleaned; raises on the first bad one."""
    return {validate_payload_path(path): content for path, content in payload.items()}


class AtomicWriter:
    """Writes payloads into ``target_dir`` (which must exist) as the module describes.

    ``log_context`` prefixes log lines, e.g. ``pod default/web volume config``.
    """

    def __init__(self, target_dir: str, log_context: str = "") -> None:
        if not os.path.isdir(target_dir):
            raise FileNotFoundError(
                errno.ENOENT, f"atomic writer target {target_dir!r} is not a directory"
            )
        self.target_dir = target_dir
        self.log_context = log_context or target_dir

    def write(
        self, payload: Mapping[str, FileProjection], set_perms: SetPerms | None = None
    ) -> bool:
        """Project ``payload`` (path → file) into the target directory. Returns whether new
        data was written (False: the payload was already there, only missing links were made).

        A bad path raises :class:`~kubevol.errors.InvalidPayloadPathError` before anything
        is written. Other failures raise ``OSError``; the previous version stays visible.
        """
        clean = validate_payload(payload)
        old_ts = self._current_ts_dir()
        to_remove: set[str] = set()
        should_write = True
        if old_ts:
            old_path = os.path.join(self.target_dir, old_ts)
            to_remove = _paths_to_remove(clean, old_path)
            if not _payload_differs(clean, old_path) and not to_remove:
                log.debug("%s: data is up to date", self.log_context)
                should_write = False
                old_ts = ""  # still current: keep it
        if should_write:
            self._publish(clean, set_perms)
        self._create_user_visible_links(clean)
        self._remove_user_visible_paths(to_remove)
        if old_ts:
            shutil.rmtree(os.path.join(self.target_dir, old_ts))
        if should_write:
            self._remove_abandoned_ts_dirs()
        return should_write

    def _current_ts_dir(self) -> str:
        """The timestamped dir ``..data`` names, or "" when there is none this writer made.

        The link is hostile input: whoever can rename entries in the volume directory can
        point it anywhere, and its target is later removed. Only a name this writer makes
        (``..YYYY_MM_DD_hh_mm_ss.N``, no slash: an absolute or ``../`` target is refused)
        that is a real directory inside the target (``lstat``: not a link) is taken; anything
        else is logged and ignored, so the next write publishes over it.
        """
        link = os.path.join(self.target_dir, DATA_DIR_NAME)
        try:
            name = os.readlink(link)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            log.warning("%s: %s is not a link; ignored", self.log_context, link)
            return ""
        if not _TS_DIR.match(name) or not _is_real_dir(os.path.join(self.target_dir, name)):
            log.warning("%s: %s points at %r, not a data directory this writer made; ignored",
                        self.log_context, link, name)
            return ""
        return name

    def _publish(self, payload: Mapping[str, FileProjection], set_perms: SetPerms | None) -> None:
        ts_dir = self._new_ts_dir()
        ts_name = os.path.basename(ts_dir)
        published = False
        try:
            _write_payload(payload, ts_dir)
            if set_perms is not None:
                set_perms(ts_name)
            new_link = os.path.join(self.target_dir, NEW_DATA_DIR_NAME)
            # A link left by a writer killed between symlink and rename would make
            # symlink() fail for ever; it is the writer's own name, so it is safe to drop.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new_link)
            os.symlink(ts_name, new_link)
            try:
                os.rename(new_link, os.path.join(self.target_dir, DATA_DIR_NAME))
            except OSError:
                _remove_quietly(new_link)
                raise
            published = True
        finally:
            if not published:
                shutil.rmtree(ts_dir, ignore_errors=True)
        log.debug("%s: published %s", self.log_context, ts_name)

    def _new_ts_dir(self) -> str:
        prefix = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
        while True:
            # Go's os.MkdirTemp appends a random uint32 in decimal: same names as the kubelet.
            path = os.path.join(self.target_dir, f"{prefix}{random.getrandbits(32)}")
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                continue
            # 0755 whatever the umask: group and others must be able to traverse it.
            os.chmod(path, 0o755)
            return path

    def _create_user_visible_links(self, payload: Mapping[str, FileProjection]) -> None:
        for top in sorted({path.split("/", 1)[0] for path in payload}):
            link = os.path.join(self.target_dir, top)
            try:
                os.readlink(link)
            except FileNotFoundError:
                os.symlink(posixpath.join(DATA_DIR_NAME, top), link)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # Something that is not a link holds the name: the kubelet leaves it.
                log.warning("%s: %s is not a link; left as it is", self.log_context, link)

    def _remove_user_visible_paths(self, paths: set[str]) -> None:
        last_error: OSError | None = None
        for path in sorted(paths):
            if "/" in path:
                continue  # only the top-level links live outside the data dir
            try:
                os.remove(os.path.join(self.target_dir, path))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("%s: cannot prune old path %s: %s", self.log_context, path, exc)
                last_error = exc
        if last_error is not None:
            raise last_error

    def _remove_abandoned_ts_dirs(self) -> None:
        """Timestamped dirs of writers killed before they published (never linked)."""
        current = self._current_ts_dir()
        for name in os.listdir(self.target_dir):
            if name != current and _TS_DIR.match(name):
                path = os.path.join(self.target_dir, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _payload_differs(payload: Mapping[str, FileProjection], old_ts_path: str) -> bool:
    for path, projection in payload.items():
        full = os.path.join(old_ts_path, path)
        try:
            with open(full, "rb") as f:
                if f.read() != projection.data:
                    return True
        except FileNotFoundError:
            return True
    return False


def _paths_to_remove(payload: Mapping[str, FileProjection], old_ts_path: str) -> set[str]:
    """Paths in the old data dir that the new payload no longer has (nor needs as a parent)."""
    current: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(old_ts_path):
        rel = os.path.relpath(dirpath, old_ts_path)
        for name in [*dirnames, *filenames]:
            current.add(name if rel == "." else f"{rel}/{name}")
    wanted: set[str] = set()
    for path in payload:
        parent = path
        while parent:
            wanted.add(parent)
            parent = posixpath.dirname(parent)
    return current - wanted


def _write_payload(payload: Mapping[str, FileProjection], ts_dir: str) -> None:
    for path, projection in payload.items():
        full = os.path.join(ts_dir, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, projection.mode)
        try:
            view = memoryview(projection.data)
            while view:
                view = view[os.write(fd, view):]
            # The mode given to open() is filtered by the umask; the payload's mode is exact.
            os.fchmod(fd, projection.mode)
            if projection.fs_user is not None:
                os.fchown(fd, projection.fs_user, -1)
        finally:
            os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
