"""Walk a directory tree and add up what it occupies, the way the kubelet's ``fs.DiskUsage`` does.

Semantics (Kubernetes ``pkg/volume/util/fs``):

- the walk stays on the root's filesystem: an entry whose ``st_dev`` differs from the
  root's is neither counted nor descended into (a nested mount is skipped whole);
- an inode with more than one link is counted once, however many names it has (this also
  keeps a same-filesystem bind mount of an ancestor from looping);
- each counted entry adds ``st_blocks * 512`` bytes and one inode; the root counts too;
- symbolic links are never followed, except the root path itself;
- an entry or directory that vanishes during the walk (``ENOENT``) is ignored;
- any other error stops the walk with a :class:`~kubevol.errors.MetricsError`
  (``FS_INFO_FAILED``) naming the path, chained to the ``OSError``.

Two implementations share these semantics: a native one (the optional C extension
``kubevol.metrics._duwalk``, which walks subtrees on several threads with the GIL released)
and a pure-Python one used where the extension was not built.
"""

from __future__ import annotations

import errno
import os
import stat
from types import ModuleType

from kubevol.errors import MetricsError
from kubevol.metrics.usage import DiskUsage

#: Bytes per unit of ``st_blocks`` (POSIX fixes it at 512 whatever the filesystem's block size).
BLOCK_UNIT = 512

# The directory lister and the stat call the Python walker uses; tests replace them to make
# entries vanish at a precise moment of the walk.
_listdir = os.listdir
_lstat = os.lstat


def _load_native() -> ModuleType | None:
    try:
        from kubevol.metrics import _duwalk
    except ImportError:
        return None
    module: ModuleType = _duwalk
    return module


def native_available() -> bool:
    """True if the C walker was built and can be used."""
    return _load_native() is not None


def default_threads() -> int:
    """How many threads the native walker uses by default: the CPUs this process may run on."""
    return max(1, min(8, len(os.sched_getaffinity(0))))


def walk(path: str, *, native: bool | None = None, threads: int | None = None) -> DiskUsage:
    """Measure the tree rooted at directory ``path`` (a symlink to a directory is followed).

    ``native`` picks the implementation: ``None`` uses the C walker when it is built,
    ``True`` requires it (:class:`RuntimeError` if it is missing), ``False`` forces the
    Python walker. ``threads`` applies to the C walker only. Reads only; safe to call
    concurrently. Raises :class:`~kubevol.errors.MetricsError` with ``FS_INFO_FAILED``
    if the root is missing or not a directory, or on any error other than ``ENOENT``
    below it.
    """
    module = None if native is False else _load_native()
    if native and module is None:
        raise RuntimeError("the native du walker (kubevol.metrics._duwalk) is not built")
    root = _root_stat(path)
    if module is not None:
        try:
            blocks, inodes = module.walk(path, default_threads() if threads is None else threads)
        except OSError as exc:
            raise MetricsError.fs_info_failed(exc.filename or path, exc) from exc
        return DiskUsage(bytes=blocks * BLOCK_UNIT, inodes=inodes, walker="native")
    return _walk_python(path, root)


def _root_stat(path: str) -> os.stat_result:
    try:
        root = os.stat(path)
    except OSError as exc:
        raise MetricsError.fs_info_failed(path, exc) from exc
    if not stat.S_ISDIR(root.st_mode):
        cause = NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        raise MetricsError.fs_info_failed(path, cause) from cause
    return root


def _walk_python(path: str, root: os.stat_result) -> DiskUsage:
    # One loop, locals only, no per-entry objects beyond the stat result: this is the
    # Python walker's hot path (see benchmarks/du.py).
    dev = root.st_dev
    blocks = root.st_blocks
    inodes = 1
    seen: set[int] = {root.st_ino} if root.st_nlink > 1 else set()
    stack = [path]
    listdir = _listdir
    lstat = _lstat
    is_dir = stat.S_ISDIR
    while stack:
        directory = stack.pop()
        try:
            names = listdir(directory)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise MetricsError.fs_info_failed(directory, exc) from exc
        prefix = directory if directory.endswith("/") else directory + "/"
        for name in names:
            entry = prefix + name
            try:
                st = lstat(entry)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise MetricsError.fs_info_failed(entry, exc) from exc
            if st.st_dev != dev:
                continue
            if st.st_nlink > 1:
                if st.st_ino in seen:
                    continue
                seen.add(st.st_ino)
            blocks += st.st_blocks
            inodes += 1
            if is_dir(st.st_mode):
                stack.append(entry)
    return DiskUsage(bytes=blocks * BLOCK_UNIT, inodes=inodes, walker="python")
