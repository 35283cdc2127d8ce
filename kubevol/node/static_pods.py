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

import logging
import os
import select
import time

import inotify_simple

from kubevol.errors import KubevolError
from kubevol.node.manifests import Manifests, load_manifest_files
from kubevol.util.lifecycle import ClosesOnExit

log = logging.getLogger(__name__)

#: The suffixes of the files read as manifests.
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

_F = inotify_simple.flags
_CHANGED = _F.CLOSE_WRITE | _F.MOVED_TO
_GONE = _F.DELETE | _F.MOVED_FROM
_DIR_GONE = _F.DELETE_SELF | _F.MOVE_SELF | _F.IGNORED


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
        #: Parsed content by file name.
        self.files: dict[str, Manifests] = {}
        #: Why a file could not be read, by file name (its previous pods are kept).
        self.errors: dict[str, str] = {}
        #: Whether the directory exists (was found and is watched).
        self.present = False
        #: :meth:`manifests` until a file changes.
        self._merged: Manifests | None = None
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
        self._merged = None
        path = os.path.join(self.path, name)
        if not os.path.isfile(path):
            self._drop(name)
            return
        try:
            self.files[name] = load_manifest_files([path])
        except KubevolError as exc:
            log.error("static pod manifest %s is not valid, its pods are kept: %s", path, exc)
            self.errors[name] = str(exc)
            return
        self.errors.pop(name, None)

    def _drop(self, name: str) -> None:
        self._merged = None
        self.files.pop(name, None)
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
        if self._merged is None:
            files = [self.files[name] for name in sorted(self.files)]
            self._merged = Manifests(
                pods=tuple(pod for m in files for pod in m.pods),
                pvs={k: v for m in files for k, v in m.pvs.items()},
                pvcs={k: v for m in files for k, v in m.pvcs.items()},
                config_maps={k: v for m in files for k, v in m.config_maps.items()},
                secrets={k: v for m in files for k, v in m.secrets.items()},
                csi_drivers={k: v for m in files for k, v in m.csi_drivers.items()},
            )
        return self._merged

    def close(self) -> None:
        """Stop watching. Idempotent."""
        if not self._inotify.closed:
            self._inotify.close()
