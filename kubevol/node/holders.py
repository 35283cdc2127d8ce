"""The last line of defence: who else still holds a path under a pod directory.

Before kubevol unmounts or removes anything under ``pods/<uid>``, it asks a
:class:`Holders` snapshot whether

* a process on the node has a file open there, or its working directory, root directory
  or executable there (the file descriptors, ``cwd``, ``root`` and ``exe`` links under
  ``/proc/<pid>``); kubevol's own process is left out: it holds directory descriptors of
  what it removes;
* a mount in *another* mount namespace is at or below the path, or shows a part of what
  the path holds (same device, and a filesystem root at or below the path's place in that
  filesystem: a container's bind of the volume, wherever it is). One ``mountinfo`` is read
  per namespace (namespaces told apart by the inode of ``/proc/<pid>/ns/mnt``). The
  caller's own namespace is what the unmount acts on, so it is not a holder; nor is a
  propagation copy of a mount the unmount removes, in the same place (same peer group, or
  a slave of it: a CSI driver's namespace with bidirectional propagation, a service's
  namespace that is a slave of the host's), since the unmount takes it away too. A bind
  of such a mount *elsewhere* stays after our unmount, whatever its peer group: a holder.

If anything holds it, the action is refused and the path left as it is: unmounting under a
process or another namespace would not free the volume, and removing would delete data
someone still uses. The snapshot is taken once per batch of actions (a reconciler pass, a
repair), not per path: one walk of ``/proc``; it keeps only what processes hold below the
pods directory, so each question is a binary search. Our own namespace's table is not
parsed whole (it lists every pod's mounts): each question finds its lines by substring
search, in the table the host's mounter holds when the caller passes it (read once per
change for every check of the node).

What it does not see: memory mappings without a descriptor (``/proc/<pid>/maps``), the
working directory of a thread that unshared its filesystem information, and what happens
between the snapshot and the action (an unmount then fails with ``EBUSY`` as before).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Iterable

import attrs

from kubevol import layout
from kubevol.errors import KubevolError
from kubevol.mount.mountinfo import MountInfo, parse_mountinfo_bytes
from kubevol.mount.mountread import read_mountinfo_bytes
from kubevol.mount.table import MountTable

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


class _Mounts:
    """What a snapshot asks of another namespace's mount table: mounts at or below ``under``
    by mount point, and every mount by device and root, each sorted for binary search.
    Built once per table (one parse); each question is a few bisects."""

    def __init__(self, entries: list[MountInfo], under: str) -> None:
        prefix = under.rstrip("/") + "/"
        below = [e for e in entries if e.mount_point == under or e.mount_point.startswith(prefix)]
        below.sort(key=lambda e: e.mount_point)  # stable: table order kept at one point
        self._below = below
        self._below_keys = [e.mount_point for e in below]
        by_dev: dict[tuple[int, int], list[MountInfo]] = {}
        for e in entries:
            by_dev.setdefault(e.device, []).append(e)
        self._by_dev = {d: sorted(es, key=lambda e: e.root) for d, es in by_dev.items()}
        self._dev_keys = {d: [e.root for e in es] for d, es in self._by_dev.items()}

    def at_or_below(self, path: str) -> list[MountInfo]:
        """Mounts whose mount point is ``path`` or below it."""
        return [self._below[i] for i in _prefix_range(self._below_keys, path)]

    def of_device(self, device: tuple[int, int], root: str) -> list[MountInfo]:
        """Mounts of ``device`` whose root is ``root`` or below it."""
        entries = self._by_dev.get(device)
        if not entries:
            return []
        return [entries[i] for i in _prefix_range(self._dev_keys[device], root)]


def _prefix_range(keys: list[str], path: str) -> list[int]:
    """Indexes of the sorted ``keys`` that are ``path`` or below it."""
    if path == "/":
        return list(range(len(keys)))
    lo = bisect.bisect_left(keys, path)
    # Everything below path sorts before path + "0" ("/" is the character before "0").
    hi = bisect.bisect_left(keys, path + "0", lo)
    return [i for i in range(lo, hi) if keys[i] == path or keys[i].startswith(path + "/")]


@attrs.frozen(kw_only=True)
class _Namespace:
    """Another mount namespace: a process in it, whether its paths are ours (its
    processes' root is our root), and its table's mounts that matter."""

    inode: int
    pid: int
    comm: str
    same_root: bool
    mounts: _Mounts


class Holders:
    """A snapshot of what processes and other mount namespaces hold below ``under``.

    Build it with :meth:`take`; ask :meth:`of` or :meth:`refuse`. Read-only.
    """

    def __init__(
        self,
        *,
        under: str,
        paths: list[tuple[str, Holder]],
        namespaces: list[tuple[int, int, str, bool, list[MountInfo]]],
        own: MountTable,
        uninspected: int = 0,
        alias: str = "",
    ) -> None:
        self.under = under
        #: ``under`` as the caller spelled it (before links were resolved).
        self._alias = alias if alias != under else ""
        self._paths = sorted(paths, key=lambda p: p[0])
        self._keys = [p for p, _ in self._paths]
        #: Our own mount table, asked per question (lines found by substring search,
        #: not a parse of the whole table: it lists every pod's mounts).
        self._own = own
        self.namespaces = [
            _Namespace(inode=ino, pid=pid, comm=comm, same_root=same,
                       mounts=_Mounts(entries, under))
            for ino, pid, comm, same, entries in namespaces
        ]
        #: Processes whose descriptors could not be read (not root); not those that exited.
        self.uninspected = uninspected

    @classmethod
    def take(
        cls, under: str, *, proc: str = PROC, exclude: Iterable[int] = (),
        own_table: MountTable | None = None,
    ) -> Holders:
        """Walk ``proc`` once; keep what lies at or below ``under`` (made real first).

        The calling process and ``exclude`` are left out. ``own_table`` is this process's
        mount table as read now (None: read from ``proc``), from the host's mounter, whose
        table is read once per change for everyone.
        """
        given, under = os.path.normpath(under), os.path.realpath(under)
        skip = {os.getpid(), *exclude}
        own_ns = _ns_inode(f"{proc}/self")
        try:
            own_root = os.stat(f"{proc}/self/root")
            root_id = (own_root.st_dev, own_root.st_ino)
        except OSError:
            root_id = (0, 0)
        prefix = under.rstrip("/") + "/"
        paths: list[tuple[str, Holder]] = []
        namespaces: list[tuple[int, int, str, bool, list[MountInfo]]] = []
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
            comm = ""
            if held:
                comm = _comm(base)
                paths += [(p, Holder(pid=pid, comm=comm, what=w, path=p)) for w, p in held]
            ns = _ns_inode(base)
            if ns and ns not in seen_ns:
                try:
                    entries = parse_mountinfo_bytes(read_mountinfo_bytes(f"{base}/mountinfo"))
                    st = os.stat(f"{base}/root")
                except OSError:
                    continue  # gone meanwhile: another process may still show its namespace
                seen_ns.add(ns)
                same_root = (st.st_dev, st.st_ino) == root_id
                namespaces.append((ns, pid, comm or _comm(base), same_root, entries))
        own = own_table or MountTable(read_mountinfo_bytes(f"{proc}/self/mountinfo"))
        return cls(under=under, paths=paths, namespaces=namespaces, own=own,
                   uninspected=uninspected, alias=given)

    def of(self, path: str) -> list[Holder]:
        """Who holds ``path`` or anything below it (processes first, one holder per other
        namespace)."""
        path = self._real(path)
        out = [self._paths[i][1] for i in _prefix_range(self._keys, path)]
        if self.namespaces:
            out += self._namespace_holders(path)
        return out

    def _real(self, path: str) -> str:
        """``path`` with links resolved, as the kernel shows the paths processes hold.

        Below ``under`` only its own prefix is resolved (once, by :meth:`take`): a link
        further down leads where the snapshot does not look anyway, and resolving every
        question's path would cost a system call per component.
        """
        path = os.path.normpath(path)
        for prefix in (self.under, self._alias):
            if prefix and (path == prefix or path.startswith(prefix + "/")):
                return self.under + path[len(prefix):]
        return os.path.realpath(path)

    def refuse(self, action: str, paths: Iterable[str]) -> None:
        """Raise :class:`VolumeHeldError` if anything holds one of ``paths`` (checked in
        order; the first held one is named)."""
        found = self._first_held(paths)
        if found is not None:
            path, holders = found
            raise VolumeHeldError(refusal(action, path, holders), path, holders)

    def why_refused(self, action: str, paths: Iterable[str]) -> str:
        """What :meth:`refuse` would say about ``action`` on ``paths``, or ``""`` when
        nothing holds any of them."""
        found = self._first_held(paths)
        return refusal(action, *found) if found is not None else ""

    def _first_held(self, paths: Iterable[str]) -> tuple[str, list[Holder]] | None:
        """The first of ``paths`` that something holds, with its holders."""
        for path in paths:
            holders = self.of(path)
            if holders:
                return path, holders
        return None

    def _containing(self, path: str) -> MountInfo | None:
        """Our mount that holds ``path`` (the latest over it or an ancestor)."""
        return self._own.find_containing(path)

    def _namespace_holders(self, path: str) -> list[Holder]:
        ours = self._own.mounted_under(path)
        # Mounts that propagate from the ones we unmount go away with them.
        groups = {f.split(":", 1)[1] for e in ours for f in e.optional_fields
                  if f.startswith("shared:")}
        sources = [(e.device, e.root) for e in ours]
        containing = self._containing(path)
        if containing is not None and containing.mount_point == path and path != "/":
            # Also the directory the mount covers, in the filesystem below it.
            containing = self._containing(os.path.dirname(path))
        if containing is not None:
            sources.append(_source_of(containing, path))
        out = []
        for ns in self.namespaces:
            found = ns.mounts.at_or_below(path) if ns.same_root else []
            found += [e for device, root in sources for e in ns.mounts.of_device(device, root)]
            if ns.same_root and groups:
                # A propagation copy in the same place goes with our unmount; a bind of
                # the same mount elsewhere (a container's) stays, whatever its group.
                found = [e for e in found
                         if not (_follows(e, groups) and layout.is_within(e.mount_point, path))]
            if found:
                out.append(Holder(pid=ns.pid, comm=ns.comm, what=MOUNT,
                                  path=found[0].mount_point, mnt_ns=ns.inode))
        return out


def _held_by(base: str, under: str, prefix: str) -> tuple[list[tuple[str, str]], bool]:
    """(what, path) that the process at ``base`` holds at ``under`` or below (``prefix``),
    and False when its descriptors may not be read (a process that exited is no holder)."""
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
    except PermissionError:
        return held, False
    except OSError:
        return held, True  # exited meanwhile: it holds nothing any more
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


def _source_of(mount: MountInfo, path: str) -> tuple[tuple[int, int], str]:
    """(device, path inside the filesystem) of ``path`` reached through ``mount``."""
    rel = path[len(mount.mount_point):].strip("/")  # path is the mount point or below it
    inside = f"{mount.root.rstrip('/')}/{rel}" if rel else mount.root
    return (mount.device, inside)


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
        self._taken_at = 0.0
        self._lock = threading.Lock()

    def get(self) -> Holders:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = self._take()
                self._taken_at = time.monotonic()
            return self._snapshot

    def younger_than(self, seconds: float) -> bool:
        """Whether the snapshot was taken less than ``seconds`` ago, or not yet (it is then
        taken when first asked: as fresh as a new batch's)."""
        with self._lock:
            return self._snapshot is None or time.monotonic() - self._taken_at < seconds
