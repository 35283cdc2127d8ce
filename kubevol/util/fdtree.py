"""Walking a directory tree that a workload can write, through directory file descriptors.

A pod's workload keeps running while kubevol tears its volumes down or re-owns their files,
and it can swap any sub-directory for a symbolic link at any moment. A walk by path
(``os.walk``, then ``unlink(path)`` or ``lchown(path)``) follows such a link between the
listing and the change, and changes files outside the tree. Here every directory is opened
relative to its parent's descriptor with ``O_NOFOLLOW | O_DIRECTORY`` and checked to be on
the tree's own mount (device number *and* mount id: a bind mount of the same filesystem has
the same device number), and the caller changes entries relative to the descriptor of the
directory holding them (``unlinkat``, ``fchownat`` without following), so a link swapped in
is itself removed or re-owned, never followed.

``shutil.rmtree`` has an fd-based mode that resists the same swap, but it does not meet the
rest: it descends into mount points below the tree (deleting what a bind mount shows), it
recurses once per level (a tree a workload made 100,000 levels deep gives RecursionError and
holds one descriptor per level), and there is no walk in it to re-own files.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import errno
import functools
import os
import posixpath
import stat
from collections.abc import Callable, Iterator
from typing import NamedTuple

from kubevol.errors import MountError, UnsafePathError
from kubevol.util.clib import libc

#: Flags every directory of a walk is opened with: never through a link, never a non-directory.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: Descriptors a walk keeps open on its way down; deeper parents are closed and re-opened
#: through ``..`` (identity checked) on the way up, so any depth needs a bounded number.
OPEN_DIRS = 64

#: How often a name whose type keeps changing under the walk is looked at before giving up.
_RETRIES = 3

_AT_EMPTY_PATH = 0x1000
_STATX_MNT_ID = 0x1000
_STATX_SIZE = 256
#: Byte offsets in ``struct statx`` (include/uapi/linux/stat.h).
_STX_MASK = 0
_STX_MNT_ID = 144


class MountPolicy(enum.Enum):
    """What a walk does at a directory that is on another mount than the tree's top."""

    #: Raise :class:`~kubevol.errors.MountError` (deleting: nothing below a mount is ours).
    REFUSE = "refuse"
    #: Leave it out of the walk (re-owning: another volume's files are not this one's).
    SKIP = "skip"


class TreeEntry(NamedTuple):
    """One entry of a walk. Descriptors are the walk's: valid until the next entry."""

    #: Descriptor of the directory holding the entry; -1 for the top of the walk.
    parent_fd: int
    #: The entry's name in that directory (change it with ``dir_fd=parent_fd``).
    name: str
    #: Where the entry was, for messages only: never used to reach it.
    path: str
    #: ``lstat`` of a non-directory, ``fstat`` of the opened directory.
    st: os.stat_result
    #: The directory's own descriptor; -1 for a non-directory (files, links, devices, ...).
    fd: int

    @property
    def is_dir(self) -> bool:
        """Whether the entry is a directory (reached, and walked, through ``fd``)."""
        return self.fd >= 0


def open_dir(path: str, *, beneath: str | None = None) -> int:
    """A descriptor of directory ``path``, opened without following a link at its end.

    With ``beneath`` (a directory ``path`` must be under), every component of ``path`` below
    ``beneath`` is opened without following links; ``beneath`` itself is trusted. Raises
    :class:`~kubevol.errors.UnsafePathError` when a component is a link or not a directory,
    ``FileNotFoundError`` when one is missing.
    """
    if beneath is None:
        return _open_sub(None, path, path)
    rel = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(beneath))
    if rel == ".." or rel.startswith("../") or posixpath.isabs(rel):
        raise UnsafePathError(errno.EXDEV, f"{path!r} is not under {beneath!r}")
    fd = os.open(beneath, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if rel != ".":
        found = _open_beneath(fd, rel)
        if found >= 0:
            os.close(fd)
            return found
    where = beneath
    try:
        for segment in ([] if rel == "." else rel.split("/")):
            where = posixpath.join(where, segment)
            sub = _open_sub(fd, segment, where)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


#: ``openat2(2)`` (Linux 5.6): its number is the same on every architecture, and the
#: ``struct open_how`` it takes (include/uapi/linux/openat2.h).
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


class _Openat2:
    #: False once ``openat2`` was found missing (a kernel before 5.6) or forbidden (a
    #: seccomp filter) in this process: no point in asking again.
    usable = True


def _open_beneath(dir_fd: int, rel: str) -> int:
    """``rel`` opened below ``dir_fd`` by the kernel in one call, refusing any link and any
    way out (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``); -1 when that fails
    for any reason, and the caller walks component by component, which says precisely
    what is wrong. Opening each component is a dozen system calls for a pod volume
    directory: this is the path kubevol takes for every volume it tears down."""
    if not _Openat2.usable:
        return -1
    how = _OpenHow(
        flags=DIR_FLAGS,
        mode=0,
        resolve=_RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
    )
    fd: int = libc().syscall(
        _SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how)
    )
    if fd < 0 and ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
        _Openat2.usable = False
    return fd


def open_parent(path: str, *, beneath: str | None = None) -> tuple[int, str]:
    """A descriptor of ``path``'s parent directory (as :func:`open_dir`) and ``path``'s name
    in it, for changes made relative to the parent (``rmdir(name, dir_fd=fd)``)."""
    path = posixpath.normpath(path)
    parent, name = posixpath.split(path)
    if not name or name in (".", ".."):
        raise UnsafePathError(errno.EINVAL, f"{path!r} has no parent directory to work from")
    return open_dir(parent or ".", beneath=beneath if beneath != path else None), name


def refuse_links(path: str, *, beneath: str | None = None) -> None:
    """Raise :class:`~kubevol.errors.UnsafePathError` when ``path`` is a symbolic link, or
    (with ``beneath``) a component of it below ``beneath`` is a link or not a directory.

    For code that acts on ``path`` by name afterwards (unmount, a mount check): a link put
    where a kubelet directory belongs must not send that code elsewhere. A missing path, or
    one whose filesystem no longer answers, passes: the caller handles those.
    """
    try:
        parent_fd, name = open_parent(path, beneath=beneath)
    except FileNotFoundError:
        return
    try:
        mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
    except OSError:
        return
    finally:
        os.close(parent_fd)
    if stat.S_ISLNK(mode):
        raise UnsafePathError(
            errno.ELOOP, f"{path!r} is a symbolic link where a directory is expected; "
            "nothing was changed through it"
        )


@contextlib.contextmanager
def opened_with_parent(path: str, *, beneath: str | None = None) -> Iterator[tuple[int, str, int]]:
    """``(parent_fd, name, fd)``: descriptors of directory ``path``'s parent (as
    :func:`open_parent`) and of ``path`` itself (as :func:`open_dir_at`), and ``path``'s name
    in the parent, both closed on leaving; for removing a directory once what it holds is
    gone (``rmdir(name, dir_fd=parent_fd)``)."""
    parent_fd, name = open_parent(path, beneath=beneath)
    try:
        fd = open_dir_at(parent_fd, name, path)
        try:
            yield parent_fd, name, fd
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def open_dir_at(parent_fd: int, name: str, path: str) -> int:
    """A descriptor of directory ``name`` in ``parent_fd``, never through a link; ``path``
    names it in errors. Raises as :func:`open_dir`."""
    return _open_sub(parent_fd, name, path)


def _open_sub(parent_fd: int | None, name: str, path: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        raise UnsafePathError(
            exc.errno, f"{path!r} is {_kind(parent_fd, name)} where a directory is expected; "
            "nothing was changed through it"
        ) from exc


def _kind(parent_fd: int | None, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
    except OSError:
        return "not a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a directory"


def mount_id(fd: int) -> int | None:
    """The id of the mount ``fd`` is on (statx ``STATX_MNT_ID``, else ``/proc`` fdinfo);
    None when the kernel cannot tell."""
    statx = _statx()
    if statx is not None:
        buf = ctypes.create_string_buffer(_STATX_SIZE)
        if statx(fd, b"", _AT_EMPTY_PATH, _STATX_MNT_ID, buf) == 0:
            if ctypes.c_uint32.from_buffer(buf, _STX_MASK).value & _STATX_MNT_ID:
                return ctypes.c_uint64.from_buffer(buf, _STX_MNT_ID).value
        else:
            err = ctypes.get_errno()
            if err not in (errno.ENOSYS, errno.EINVAL):
                raise OSError(err, os.strerror(err))
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None


@functools.cache
def _statx() -> Callable[..., int] | None:
    try:
        return libc().statx
    except AttributeError:  # a libc without statx
        return None


class _Frame:
    """A directory on the walk's way down: its descriptor (-1 while closed to keep the count
    of open ones bounded), identity and the names still to visit."""

    __slots__ = ("fd", "name", "names", "owned", "path", "st")

    def __init__(self, fd: int, name: str, path: str, st: os.stat_result, owned: bool) -> None:
        self.fd = fd
        self.name = name
        self.path = path
        self.st = st
        self.owned = owned
        self.names = os.listdir(fd)


def walk(top_fd: int, top_path: str, *, mounts: MountPolicy = MountPolicy.REFUSE
         ) -> Iterator[TreeEntry]:
    """Every entry under the directory ``top_fd`` (``top_path`` for messages), and the top.

    Non-directories come as they are met, directories after everything under them (so a
    caller can delete as it goes), the top last with ``parent_fd`` -1. A directory on another
    mount than the top (other device number or mount id) is refused or skipped per
    ``mounts``. An entry listed as a directory and swapped for something else before it is
    opened comes as what it became; one that vanished is left out. Raises
    :class:`~kubevol.errors.UnsafePathError` when a directory is moved away while walked.
    The caller keeps ``top_fd``; the walk closes every descriptor it opened.
    """
    top_st = os.fstat(top_fd)
    top_mount = mount_id(top_fd)
    frames = [_Frame(top_fd, "", top_path, top_st, owned=False)]
    try:
        while frames:
            frame = frames[-1]
            if not frame.names:
                frames.pop()
                parent = frames[-1] if frames else None
                if parent is not None and parent.fd < 0:
                    parent.fd = _reopen_parent(frame.fd, parent)
                yield TreeEntry(
                    parent.fd if parent is not None else -1, frame.name, frame.path,
                    frame.st, frame.fd,
                )
                if frame.owned:
                    os.close(frame.fd)
                continue
            name = frame.names.pop()
            path = posixpath.join(frame.path, name)
            entry = _look(frame.fd, name, path)
            if entry is None:
                continue
            if isinstance(entry, os.stat_result):
                yield TreeEntry(frame.fd, name, path, entry, -1)
                continue
            fd = entry
            st = os.fstat(fd)
            if st.st_dev != top_st.st_dev or (top_mount is not None and mount_id(fd) != top_mount):
                os.close(fd)
                if mounts is MountPolicy.SKIP:
                    continue
                raise MountError(f"{path!r} is a mount point under {top_path!r}; left in place")
            try:
                frames.append(_Frame(fd, name, path, st, owned=True))
            except BaseException:
                os.close(fd)
                raise
            if len(frames) > OPEN_DIRS:
                far = frames[-OPEN_DIRS - 1]
                if far.owned and far.fd >= 0:
                    os.close(far.fd)
                    far.fd = -1
    finally:
        for frame in frames:
            if frame.owned and frame.fd >= 0:
                os.close(frame.fd)


def _look(dir_fd: int, name: str, path: str) -> int | os.stat_result | None:
    """A directory's descriptor, a non-directory's lstat, or None when ``name`` is gone."""
    for _ in range(_RETRIES):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return st
        try:
            return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            # Swapped for a link (or a file) since the lstat: look at what it is now.
    raise UnsafePathError(errno.EAGAIN, f"{path!r} keeps changing type while walked")


def _reopen_parent(child_fd: int, parent: _Frame) -> int:
    fd = os.open("..", DIR_FLAGS, dir_fd=child_fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (parent.st.st_dev, parent.st.st_ino):
        os.close(fd)
        raise UnsafePathError(
            errno.EAGAIN, f"{parent.path!r} no longer holds the directory being walked"
        )
    return fd
