"""The last line of defence: who else still holds a path under a pod directory.

Before kubevol unmounts or removes anything under ``pods/<uid>``, it asks a
:class:`Holders` snapshot whether

* a process on the node has a file open there, or its working directory, root directory
  or executable there (the file descriptors, ``cwd``, ``root`` and ``exe`` links under
  ``/proc/<pid>``); kubevol's own process is left out: it holds directory descriptors of
  what it removes;
* a mount in *another* mount namespace is at or below the path, or shows a part of what
  the path holds (same device, and a filesystem root at or below the path's place in that
  filesystem: a container's bind of the volume). One ``mountinfo`` is read per namespace
  (namespaces told apart by the inode of ``/proc/<pid>/ns/mnt``). The caller's own
  namespace is what the unmount acts on, so it is not a holder; nor is a mount that is a
  propagation copy of one the unmount removes (same peer group, or a slave of it: a CSI
  driver's namespace with bidirectional propagation), since the unmount takes it away too.

If anything holds it, the action is refused and the path left as it is: unmounting under a
process or another namespace would not free the volume, and removing would delete data
someone still uses. The snapshot is taken once per batch of actions (a reconciler pass, a
repair), not per path: one walk of ``/proc``; it keeps only what lies below the pods
directory, so each question is a binary search.

What it does not see: memory mappings without a descriptor (``/proc/<pid>/maps``), the
working directory of a thread that unshared its filesystem information, and what happens
between the snapshot and the action (an unmount then fails with ``EBUSY`` as before).
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Iterable

import attrs

from kubevol.errors import KubevolError
from kubevol.mount.mountinfo import MountInfo
from kubevol.mount.table import MountTable, read_mountinfo_bytes

PROC = "/proc"

#: What a process holds (``Holder.what``).
CWD = "working directory"
ROOT = "root directory"
EXE = "executable"
OPEN_FILE = "open file"
#: A mount in another mount namespace.
MOUNT = "mount"

_LINKS = (("cwd", CWD), ("root", ROOT), ("exe", EXE))
_DELETED = " (deleted)"


@attrs.frozen(kw_only=True)
class Holder:
    """A process, or a mount namespace, that holds a path."""

    pid: int
    #: The process's command name (``/proc/<pid>/comm``); ``?`` when it could not be read.
    comm: str
    what: str
    path: str
    #: For :data:`MOUNT`: the inode of the namespace (``mnt:[<inode>]``); ``pid`` is a
    #: process in it.
    mnt_ns: int = 0

    def __str__(self) -> str:
        if self.what == MOUNT:
            return (
                f"mount namespace mnt:[{self.mnt_ns}] (process {self.pid} ({self.comm}) is in "
                f"it) has {self.path} mounted"
            )
        return f"process {self.pid} ({self.comm}) has its {self.what} {self.path}"


class VolumeHeldError(KubevolError):
    """An unmount or removal under a pod directory was refused: ``holders`` (processes or
    other mount namespaces) still use ``path``. Nothing of it was changed."""

    def __init__(self, message: str, path: str, holders: Iterable[Holder]) -> None:
        super().__init__(message)
        self.path = path
        self.holders: tuple[Holder, ...] = tuple(holders)


def refusal(action: str, path: str, holders: list[Holder]) -> str:
    """The message of a refused ``action`` on ``path``: the holders, the first few named."""
    named = "; ".join(str(h) for h in holders[:3])
    more = f" (and {len(holders) - 3} more)" if len(holders) > 3 else ""
    return f"refusing to {action} {path}: {named}{more}; left in place"


@attrs.frozen(kw_only=True)
class _Namespace:
    """Another mount namespace: its table, a process in it, whether its paths are ours
    (its processes' root is our root)."""

    inode: int
    pid: int
    comm: str
    same_root: bool
    table: MountTable


class Holders:
    """A snapshot of what processes and other mount namespaces hold below ``under``.

    Build it with :meth:`take`; ask :meth:`of` or :meth:`refuse`. Read-only.
    """

    def __init__(
        self,
        *,
        under: str,
        paths: list[tuple[str, Holder]],
        namespaces: list[_Namespace],
        own_table: MountTable,
        uninspected: int = 0,
    ) -> None:
        self.under = under
        self._paths = sorted(paths, key=lambda p: p[0])
        self._keys = [p for p, _ in self._paths]
        self.namespaces = namespaces
        self._own = own_table
        #: Processes whose descriptors could not be read (not root, or exited meanwhile).
        self.uninspected = uninspected

    @classmethod
    def take(
        cls, under: str, *, proc: str = PROC, exclude: Iterable[int] = ()
    ) -> Holders:
        """Walk ``proc`` once; keep what lies at or below ``under`` (made real first).

        The calling process and ``exclude`` are left out.
        """
        under = os.path.realpath(under)
        skip = {os.getpid(), *exclude}
        own_ns = _ns_inode(f"{proc}/self")
        try:
            own_root = os.stat(f"{proc}/self/root")
            root_id = (own_root.st_dev, own_root.st_ino)
        except OSError:
            root_id = (0, 0)
        prefix = under.rstrip("/") + "/"
        paths: list[tuple[str, Holder]] = []
        namespaces: list[_Namespace] = []
        seen_ns = {own_ns}
        uninspected = 0
        try:
            names = os.listdir(proc)
        except OSError:
            names = []
        for name in names:
            if not name.isdigit() or int(name) in skip:
                continue
            pid, base = int(name), f"{proc}/{name}"
            held, readable = _held_by(base, under, prefix)
            uninspected += not readable
            ns = _ns_inode(base)
            comm = ""
            if held:
                comm = _comm(base)
                paths += [(p, Holder(pid=pid, comm=comm, what=w, path=p)) for w, p in held]
            if ns and ns not in seen_ns:
                try:
                    table = MountTable(read_mountinfo_bytes(f"{base}/mountinfo"))
                    st = os.stat(f"{base}/root")
                except OSError:
                    continue  # gone meanwhile: another process may still show its namespace
                seen_ns.add(ns)
                namespaces.append(_Namespace(
                    inode=ns, pid=pid, comm=comm or _comm(base),
                    same_root=(st.st_dev, st.st_ino) == root_id, table=table,
                ))
        return cls(
            under=under, paths=paths, namespaces=namespaces,
            own_table=MountTable(read_mountinfo_bytes(f"{proc}/self/mountinfo")),
            uninspected=uninspected,
        )

    def of(self, path: str) -> list[Holder]:
        """Who holds ``path`` or anything below it (processes first, one holder per other
        namespace)."""
        path = os.path.realpath(path)
        out = [self._paths[i][1] for i in self._range(path)]
        if self.namespaces:
            out += self._namespace_holders(path)
        return out

    def refuse(self, action: str, paths: Iterable[str]) -> None:
        """Raise :class:`VolumeHeldError` if anything holds one of ``paths`` (checked in
        order; the first held one is named)."""
        for path in paths:
            holders = self.of(path)
            if holders:
                raise VolumeHeldError(refusal(action, path, holders), path, holders)

    def _range(self, path: str) -> list[int]:
        keys = self._keys
        lo = bisect.bisect_left(keys, path)
        # Everything below path sorts before path + "0" ("/" is the character before "0").
        hi = bisect.bisect_left(keys, path + "0", lo)
        return [i for i in range(lo, hi) if keys[i] == path or keys[i].startswith(path + "/")]

    def _namespace_holders(self, path: str) -> list[Holder]:
        ours = self._own.mounted_under(path)
        # Mounts that propagate from the ones we unmount go away with them.
        groups = {f.split(":", 1)[1] for e in ours for f in e.optional_fields
                  if f.startswith("shared:")}
        sources = [(e.major, e.minor, e.root) for e in ours]
        containing = self._own.find_containing(path)
        if containing is not None and containing.mount_point == path:
            # Also the directory the mount covers, in the filesystem below it.
            parent = self._own.find_containing(os.path.dirname(path))
            if parent is not None and parent is not containing:
                sources.append(_source_of(parent, path))
        elif containing is not None:
            sources.append(_source_of(containing, path))
        out = []
        for ns in self.namespaces:
            found: list[MountInfo] = []
            if ns.same_root:
                found = ns.table.mounted_under(path)
            if not found:
                found = [e for major, minor, root in sources
                         for e in ns.table.with_device(major, minor, root, under=True)]
            found = [e for e in found if not _follows(e, groups)]
            if found:
                out.append(Holder(pid=ns.pid, comm=ns.comm, what=MOUNT,
                                  path=found[0].mount_point, mnt_ns=ns.inode))
        return out


def _held_by(base: str, under: str, prefix: str) -> tuple[list[tuple[str, str]], bool]:
    """(what, path) that the process at ``base`` holds at ``under`` or below (``prefix``),
    and whether its descriptors could be read."""
    held: list[tuple[str, str]] = []
    for link, what in _LINKS:
        try:
            target = os.readlink(f"{base}/{link}")
        except OSError:
            continue
        if target == under or target.startswith(prefix):
            held.append((what, target))
    try:
        fds = os.listdir(f"{base}/fd")
    except OSError:
        return held, False
    for fd in fds:
        try:
            target = os.readlink(f"{base}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.endswith(_DELETED):
            target = target[: -len(_DELETED)]
        if target == under or target.startswith(prefix):
            held.append((OPEN_FILE, target))
    return held, True


def _source_of(mount: MountInfo, path: str) -> tuple[int, int, str]:
    """(major, minor, path inside the filesystem) of ``path`` reached through ``mount``."""
    rel = os.path.relpath(path, mount.mount_point)
    inside = mount.root if rel == "." else os.path.normpath(os.path.join(mount.root, rel))
    return (mount.major, mount.minor, inside)


def _follows(entry: MountInfo, groups: set[str]) -> bool:
    """Whether ``entry`` is a propagation peer or slave of one of peer ``groups``."""
    for field in entry.optional_fields:
        kind, _, group = field.partition(":")
        if kind in ("shared", "master") and group in groups:
            return True
    return False


def _ns_inode(base: str) -> int:
    try:
        return os.stat(f"{base}/ns/mnt").st_ino
    except OSError:
        return 0


def _comm(base: str) -> str:
    try:
        with open(f"{base}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


class HoldersOnce:
    """One :class:`Holders` snapshot for a batch of actions, taken when the first action
    asks (never when none does). Thread-safe: the actions of a pass run on workers."""

    def __init__(self, take: Callable[[], Holders]) -> None:
        self._take = take
        self._snapshot: Holders | None = None
        self._lock = threading.Lock()

    def get(self) -> Holders:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = self._take()
            return self._snapshot
