"""Static pods: a directory of manifest files (the kubelet's ``--pod-manifest-path``),
watched with inotify.

Every file whose name does not start with ``.`` and ends in ``.yaml``, ``.yml`` or ``.json``
holds Pods and the objects they use (see :mod:`kubevol.node.manifests`). A file is (re-)read
only when a writer closed it (``IN_CLOSE_WRITE``) or it was renamed into the directory
(``IN_MOVED_TO``), so a half-written file is never read and an editor's write-to-temporary
then rename counts as one change; a file that goes (``IN_DELETE``, ``IN_MOVED_FROM``) takes
its pods with it. A file that cannot be parsed keeps the pods it had (none if it is new)
and is reported in :attr:`ManifestDirectory.errors`, as the kubelet keeps running pods whose
manifest went bad.

``inotify_simple`` is a thin wrapper over the three system calls; the watch itself (which
events mean "changed") is the part that matters and lives here.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import select
import time
from collections.abc import Hashable, Mapping
from typing import TypeVar

import inotify_simple

from kubevol.errors import KubevolError
from kubevol.node.manifests import ApiDict, Manifests, load_manifest_files
from kubevol.util.lifecycle import ClosesOnExit

log = logging.getLogger(__name__)

#: The suffixes of the files read as manifests.
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

_F = inotify_simple.flags
_CHANGED = _F.CLOSE_WRITE | _F.MOVED_TO
_GONE = _F.DELETE | _F.MOVED_FROM
_DIR_GONE = _F.DELETE_SELF | _F.MOVE_SELF | _F.IGNORED
#: The kinds of :class:`Manifests` kept by name.
_KEYED = ("pvs", "pvcs", "config_maps", "secrets", "csi_drivers")

_K = TypeVar("_K", bound=Hashable)


def is_manifest_name(name: str) -> bool:
    """Whether a file of this name in the directory is read as a manifest."""
    return not name.startswith(".") and name.endswith(MANIFEST_SUFFIXES)


class ManifestDirectory(ClosesOnExit):
    """The pods of a static-pod directory, kept current by :meth:`wait`. Not thread-safe.

    A directory that does not exist yet is waited for, as the kubelet waits for its
    ``--pod-manifest-path`` (:attr:`present` is False until then: no pods, and none known to
    be gone). Raises :class:`~kubevol.errors.KubevolError` when ``path`` exists and is not a
    directory.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise KubevolError(f"static pod directory {self.path!r} is not a directory")
        self._inotify = inotify_simple.INotify()
        #: Parsed content by file name, and the names in order.
        self.files: dict[str, Manifests] = {}
        self._names: list[str] = []
        #: Why a file could not be read, by file name (its previous pods are kept).
        self.errors: dict[str, str] = {}
        #: Whether the directory exists (was found and is watched).
        self.present = False
        #: :meth:`manifests` as last merged, the files it was merged from, and which files
        #: define each object name (per kind): a change re-merges only the names its files
        #: define, so one pod's file costs the same with 5 or 5,000 files present.
        self._merged = Manifests()
        self._merged_files: dict[str, Manifests] = {}
        #: The files read or dropped since the last merge.
        self._dirty: set[str] = set()
        self._definers: dict[str, dict[Hashable, set[str]]] = {k: {} for k in _KEYED}
        if not self._start():
            log.warning("static pod directory %s does not exist yet: waiting for it",
                        self.path)

    def _start(self) -> bool:
        """Watch and read the directory if it is there now; whether it is."""
        try:
            self._inotify.add_watch(self.path, _CHANGED | _GONE | _DIR_GONE)
        except FileNotFoundError:
            return False
        except NotADirectoryError as exc:
            raise KubevolError(f"static pod directory {self.path!r} is not a directory") from exc
        self.present = True
        for name in sorted(os.listdir(self.path)):
            if is_manifest_name(name):
                self._read(name)
        return True

    def fileno(self) -> int:
        """The inotify descriptor (readable when something happened)."""
        return int(self._inotify.fileno())

    def _read(self, name: str) -> None:
        path = os.path.join(self.path, name)
        if not os.path.isfile(path):
            self._drop(name)
            return
        try:
            if name not in self.files:
                bisect.insort(self._names, name)
            self.files[name] = load_manifest_files([path])
            self._dirty.add(name)
        except KubevolError as exc:
            log.error("static pod manifest %s is not valid, its pods are kept: %s", path, exc)
            self.errors[name] = str(exc)
            return
        self.errors.pop(name, None)

    def _drop(self, name: str) -> None:
        self._dirty.add(name)
        if self.files.pop(name, None) is not None:
            self._names.remove(name)
        self.errors.pop(name, None)

    def wait(self, timeout: float) -> bool:
        """Apply what happened in the directory, waiting up to ``timeout`` seconds for a
        first event; returns whether the set of files or their content changed. Until the
        directory exists, looks for it once per call (after ``timeout``)."""
        if not self.present:
            time.sleep(max(0.0, timeout))
            if not self._start():
                return False
            log.info("static pod directory %s appeared: %d files read", self.path,
                     len(self.files) + len(self.errors))
            return True
        ready, _, _ = select.select([self._inotify], [], [], max(0.0, timeout))
        if not ready:
            return False
        changed: set[str] = set()
        rescan = False
        for event in self._inotify.read(timeout=0):
            if event.mask & _F.Q_OVERFLOW:
                rescan = True
            elif event.mask & _DIR_GONE:
                raise KubevolError(f"static pod directory {self.path!r} went away")
            elif is_manifest_name(event.name) and event.mask & (_CHANGED | _GONE):
                changed.add(event.name)
        if rescan:
            # Events were lost: read everything again.
            names = {n for n in os.listdir(self.path) if is_manifest_name(n)}
            changed = names | set(self.files)
        for name in sorted(changed):
            self._read(name)
        return bool(changed)

    def manifests(self) -> Manifests:
        """Every file's objects, merged in file-name order (a later file wins on a name
        clash, as :meth:`Manifests.merged`); the same object until a file changes, its
        objects those of the files (a file not read again keeps its objects)."""
        changed = {n for n in self._dirty if self.files.get(n) is not self._merged_files.get(n)}
        self._dirty.clear()
        if not changed:
            return self._merged
        pods = self._merged.pods
        if any(m.pods for n in changed
               for m in (self.files.get(n), self._merged_files.get(n)) if m is not None):
            files = self.files
            pods = tuple(itertools.chain.from_iterable([files[n].pods for n in self._names]))
        last = self._merged
        self._merged = Manifests(
            pods=pods,
            pvs=self._remerge("pvs", last.pvs, changed),
            pvcs=self._remerge("pvcs", last.pvcs, changed),
            config_maps=self._remerge("config_maps", last.config_maps, changed),
            secrets=self._remerge("secrets", last.secrets, changed),
            csi_drivers=self._remerge("csi_drivers", last.csi_drivers, changed),
        )
        for n in changed:
            if n in self.files:
                self._merged_files[n] = self.files[n]
            else:
                del self._merged_files[n]
        return self._merged

    def _remerge(
        self, kind: str, old: Mapping[_K, ApiDict], changed: set[str]
    ) -> Mapping[_K, ApiDict]:
        """The merged objects of ``kind`` after the files ``changed`` changed: the last
        merge's (``old``), with the names those files define (or defined) merged again."""
        definers = self._definers[kind]
        names: set[_K] = set()
        for n in changed:
            before = self._merged_files.get(n)
            after = self.files.get(n)
            for key in getattr(before, kind) if before is not None else ():
                definers[key].discard(n)
                names.add(key)
            for key in getattr(after, kind) if after is not None else ():
                definers.setdefault(key, set()).add(n)
                names.add(key)
        if not names:
            return old
        merged = dict(old)
        for key in names:
            files = definers.get(key)
            if files:
                merged[key] = getattr(self.files[max(files)], kind)[key]  # the last file wins
            else:
                definers.pop(key, None)
                merged.pop(key, None)
        return merged

    def close(self) -> None:
        """Stop watching. Idempotent."""
        if not self._inotify.closed:
            self._inotify.close()
