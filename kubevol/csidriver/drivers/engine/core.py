"""The engine: one driver instance's state, its store, its backend and its locks.

Locking: a per-key lock serialises the calls on one volume (or one name being created), so
slow work (copies, mounts) on different volumes runs in parallel; a short mutex guards the
state itself. A change is applied to the in-memory state and saved to the store before the
call returns: when saving fails, the change is undone and the call fails.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from kubevol.csidriver.drivers.engine.backend import VolumeBackend
from kubevol.csidriver.drivers.engine.records import (
    GroupSnapshotRecord,
    SnapshotRecord,
    VolumeRecord,
)
from kubevol.csidriver.drivers.engine.settings import DriverSettings
from kubevol.csidriver.drivers.engine.state import DriverState, StateStore
from kubevol.util.keyedlocks import KeyedLocks

T = TypeVar("T")


class Engine:
    """State, store, backend and locks of one driver instance; the services' shared core."""

    def __init__(self, settings: DriverSettings, backend: VolumeBackend, store: StateStore) -> None:
        self.settings = settings
        self.backend = backend
        self._store = store
        self._state = store.load()
        self._mutex = threading.Lock()
        self._save_lock = threading.Lock()
        self._version = 0
        self._saved_version = 0
        #: (table, key) of the records changed since the last save.
        self._unsaved: set[tuple[str, str]] = set()
        #: Per volume id, snapshot id ("snap:" prefix) or name being created ("name:").
        self.locks: KeyedLocks[str] = KeyedLocks()
        self._reserved = 0

    # --- reads ----------------------------------------------------------------------

    def read(self, fn: Callable[[DriverState], T]) -> T:
        """``fn(state)`` under the mutex; ``fn`` must not keep references to the dicts."""
        with self._mutex:
            return fn(self._state)

    def volume(self, volume_id: str) -> VolumeRecord | None:
        """The volume ``volume_id``, or None."""
        return self.read(lambda s: s.volumes.get(volume_id))

    def snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        """The snapshot ``snapshot_id``, or None."""
        return self.read(lambda s: s.snapshots.get(snapshot_id))

    def group(self, group_id: str) -> GroupSnapshotRecord | None:
        """The group snapshot ``group_id``, or None."""
        return self.read(lambda s: s.groups.get(group_id))

    def volumes(self) -> list[VolumeRecord]:
        """Every volume."""
        return self.read(lambda s: list(s.volumes.values()))

    def snapshots(self) -> list[SnapshotRecord]:
        """Every snapshot."""
        return self.read(lambda s: list(s.snapshots.values()))

    def used_bytes(self) -> int:
        """Capacity given to volumes, plus what creations in progress reserved."""
        with self._mutex:
            return self._state.capacity_bytes() + self._reserved

    # --- writes ---------------------------------------------------------------------

    def commit(self, fn: Callable[[DriverState], T]) -> T:
        """Apply ``fn`` to the state and save it; when saving fails, undo what ``fn``
        changed and re-raise.

        The state journals what ``fn`` changes, so the cost of a change does not grow with
        the state: an incremental store gets just the changed records. Saves are grouped:
        the change is applied under the mutex, then the caller waits for the save lock;
        whoever holds it writes every change made so far, so concurrent calls share one
        write (and one fsync) instead of queueing for one each.
        """
        with self._mutex:
            self._state.begin()
            try:
                result = fn(self._state)
            except BaseException:
                self._state.undo(self._state.end())
                raise
            changes = self._state.end()
            if not changes:
                return result
            self._unsaved.update((name, key) for name, key, _, _ in changes)
            self._version += 1
            version = self._version
        with self._save_lock:
            if self._saved_version >= version:
                return result
            keys: set[tuple[str, str]] = set()
            try:
                with self._mutex:
                    keys, self._unsaved = self._unsaved, set()
                    latest = self._version
                    if self._store.incremental:
                        records = [(n, k, self._state.record(n, k)) for n, k in sorted(keys)]
                    else:
                        whole = self._state.copy()
                if self._store.incremental:
                    self._store.save_records(records)
                else:
                    self._store.save(whole)
            except BaseException:
                with self._mutex:
                    self._state.undo(changes)
                    # Whoever saves next writes these records as they are then.
                    self._unsaved |= keys
                raise
            self._saved_version = latest
        return result

    def put_volume(self, volume: VolumeRecord) -> None:
        """Store (or replace) a volume record."""
        self.commit(lambda s: s.volumes.__setitem__(volume.volume_id, volume))

    def drop_volume(self, volume_id: str) -> None:
        """Forget a volume."""
        self.commit(lambda s: s.volumes.pop(volume_id, None))

    @contextlib.contextmanager
    def reservation(self, size: int, available: Callable[[int, int], None]) -> Iterator[None]:
        """Reserve ``size`` bytes for a creation in progress.

        ``available(used, size)`` runs under the mutex and raises when ``size`` does not fit;
        the reservation ends when the block exits (by then the volume record counts instead).
        """
        with self._mutex:
            used = self._state.capacity_bytes() + self._reserved
            available(used, size)
            self._reserved += size
        try:
            yield
        finally:
            with self._mutex:
                self._reserved -= size

    def close(self) -> None:
        """Release the backend's resources."""
        self.backend.close()
