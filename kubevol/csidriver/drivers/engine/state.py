"""A driver's state and where it is kept.

:class:`DriverState` is the one mutable container of records; only the engine changes it,
under its lock, and hands what changed to a :class:`StateStore` after every change. The mock
keeps it in memory (:class:`MemoryStore`); the hostpath driver keeps one row per record in
SQLite (:class:`kubevol.csidriver.drivers.hostpath.state.SqliteStore`).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final, TypeVar, overload

from kubevol.csidriver.drivers.engine.records import (
    GroupSnapshotRecord,
    SnapshotRecord,
    VolumeRecord,
    group_from_json,
    group_to_json,
    snapshot_from_json,
    snapshot_to_json,
    volume_from_json,
    volume_to_json,
)
from kubevol.errors import KubevolError

#: Version of the JSON layout :meth:`DriverState.to_json` writes.
STATE_FORMAT = 1


class DriverStateError(KubevolError, ValueError):
    """A stored driver state cannot be read; the message names the file or the field."""


#: The tables of a state, by the names stores keep them under.
TABLES = ("volumes", "snapshots", "groups")

#: A changed record: ``(table, key, record now)``, the record None when it was removed.
Record = tuple[str, str, object]

#: A change journaled by :meth:`DriverState.end`: ``(table, key, before, after)``, each of
#: ``before``/``after`` a record or the absent-marker.
Change = tuple[str, str, object, object]

_V = TypeVar("_V")
_T = TypeVar("_T")


class _Absent(enum.Enum):
    """The marker for a key that is not in a table (None could be a value)."""

    ABSENT = "absent"


_ABSENT: Final = _Absent.ABSENT


class _Table(dict[str, _V]):
    """A dict of records that, while its journal is open, notes ``(table, key, value
    before)`` for every key it changes, so a commit knows what it changed in O(changes), not
    O(state); and that keeps its records' names indexed and their capacities summed, so
    that a lookup by name (every CreateVolume) and the space in use (every creation's
    reservation) cost the same with 10 records as with 20,000."""

    __slots__ = ("by_name", "capacity", "journal", "name")

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.journal: list[tuple[str, str, object]] | None = None
        #: Record name -> the keys of the records with that name (insertion order).
        self.by_name: dict[str, dict[str, None]] = {}
        #: The sum of the records' ``capacity_bytes`` (volumes; 0 in the other tables).
        self.capacity = 0

    def _note(self, key: str) -> None:
        if self.journal is not None:
            self.journal.append((self.name, key, dict.get(self, key, _ABSENT)))

    def _index(self, key: str, before: object, after: object) -> None:
        if before is not _ABSENT:
            name = getattr(before, "name", None)
            keys = self.by_name.get(name) if isinstance(name, str) else None
            if isinstance(name, str) and keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self.by_name[name]
            self.capacity -= getattr(before, "capacity_bytes", 0)
        if after is not _ABSENT:
            name = getattr(after, "name", None)
            if isinstance(name, str):
                self.by_name.setdefault(name, {})[key] = None
            self.capacity += getattr(after, "capacity_bytes", 0)

    def put(self, key: str, value: _V) -> None:
        """Set ``key`` without journaling (loading, copying, undoing)."""
        before = dict.get(self, key, _ABSENT)
        dict.__setitem__(self, key, value)
        self._index(key, before, value)

    def drop(self, key: str) -> None:
        """Remove ``key`` (if present) without journaling."""
        before = dict.pop(self, key, _ABSENT)
        if before is not _ABSENT:
            self._index(key, before, _ABSENT)

    def first_named(self, name: str) -> _V | None:
        """The first record stored under ``name``, or None."""
        keys = self.by_name.get(name)
        return dict.get(self, next(iter(keys))) if keys else None

    def __setitem__(self, key: str, value: _V) -> None:
        self._note(key)
        self.put(key, value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._note(key)
        self.drop(key)

    @overload
    def pop(self, key: str, /) -> _V: ...
    @overload
    def pop(self, key: str, default: _V, /) -> _V: ...
    @overload
    def pop(self, key: str, default: _T, /) -> _V | _T: ...
    def pop(self, key: str, /, *default: object) -> object:
        if key in self:
            self._note(key)
            value = dict.__getitem__(self, key)
            self.drop(key)
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def popitem(self) -> tuple[str, _V]:
        key = next(reversed(self))
        return key, self.pop(key)

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def __ior__(self, other: Any) -> _Table[_V]:  # type: ignore[override,misc]
        self.update(other)
        return self


class DriverState:
    """Volumes, snapshots and group snapshots by id. Not thread-safe: the engine locks.

    Between :meth:`begin` and :meth:`end` every change to the tables is journaled, so the
    engine learns what a call changed (to save just that, or undo it) without comparing
    whole states.
    """

    def __init__(self) -> None:
        self.volumes: _Table[VolumeRecord] = _Table("volumes")
        self.snapshots: _Table[SnapshotRecord] = _Table("snapshots")
        self.groups: _Table[GroupSnapshotRecord] = _Table("groups")
        self._journal: list[tuple[str, str, object]] = []

    def copy(self) -> DriverState:
        """A copy sharing the (immutable) records."""
        other = DriverState()
        for name in TABLES:
            table = other.table(name)
            for key, record in self.table(name).items():
                table.put(key, record)
        return other

    def table(self, name: str) -> _Table[object]:
        """The table ``name`` (one of :data:`TABLES`)."""
        table: _Table[object] = getattr(self, name)
        return table

    def record(self, name: str, key: str) -> object:
        """The record ``key`` of table ``name``, or None."""
        return self.table(name).get(key)

    def begin(self) -> None:
        """Start journaling changes (the engine's commit, under its lock)."""
        self._journal = []
        for name in TABLES:
            self.table(name).journal = self._journal

    def end(self) -> list[Change]:
        """Stop journaling; ``(table, key, before, after)`` of each changed key, once each
        (``before``/``after`` is an absent-marker for a key that did not/does not exist)."""
        for name in TABLES:
            self.table(name).journal = None
        first: dict[tuple[str, str], object] = {}
        for name, key, before in self._journal:
            first.setdefault((name, key), before)
        self._journal = []
        return [
            (name, key, before, dict.get(self.table(name), key, _ABSENT))
            for (name, key), before in first.items()
            if before is not dict.get(self.table(name), key, _ABSENT)
        ]

    def undo(self, changes: list[Change]) -> None:
        """Put back the value before each change that nobody changed again since."""
        for name, key, before, after in reversed(changes):
            table = self.table(name)
            if dict.get(table, key, _ABSENT) is not after:
                continue
            if before is _ABSENT:
                table.drop(key)
            else:
                table.put(key, before)

    def volume_by_name(self, name: str) -> VolumeRecord | None:
        """The volume created under ``name``, if any (O(1))."""
        return self.volumes.first_named(name)

    def snapshot_by_name(self, name: str) -> SnapshotRecord | None:
        """The snapshot created under ``name``, if any (O(1))."""
        return self.snapshots.first_named(name)

    def group_by_name(self, name: str) -> GroupSnapshotRecord | None:
        """The group snapshot created under ``name``, if any (O(1))."""
        return self.groups.first_named(name)

    def capacity_bytes(self) -> int:
        """The capacity of every volume together (O(1))."""
        return self.volumes.capacity

    def to_json(self) -> dict[str, object]:
        """Everything as one JSON-friendly dict."""
        return {
            "format": STATE_FORMAT,
            "volumes": [volume_to_json(v) for v in self.volumes.values()],
            "snapshots": [snapshot_to_json(s) for s in self.snapshots.values()],
            "groups": [group_to_json(g) for g in self.groups.values()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DriverState:
        """Read what :meth:`to_json` wrote. Raises :class:`DriverStateError` when malformed."""
        if data.get("format") != STATE_FORMAT:
            raise DriverStateError(
                f"driver state has format {data.get('format')!r}, expected {STATE_FORMAT}"
            )
        state = cls()
        try:
            for item in data.get("volumes", ()):
                vol = volume_from_json(item)
                state.volumes[vol.volume_id] = vol
            for item in data.get("snapshots", ()):
                snap = snapshot_from_json(item)
                state.snapshots[snap.snapshot_id] = snap
            for item in data.get("groups", ()):
                group = group_from_json(item)
                state.groups[group.group_snapshot_id] = group
        except (KeyError, TypeError, ValueError) as exc:
            raise DriverStateError(f"malformed driver state: {exc!r}") from exc
        return state


#: Per table: the record to JSON (the record's type depends on the table), JSON to record.
_CODECS: dict[
    str, tuple[Callable[[Any], dict[str, object]], Callable[[Mapping[str, Any]], object]]
] = {
    "volumes": (volume_to_json, volume_from_json),
    "snapshots": (snapshot_to_json, snapshot_from_json),
    "groups": (group_to_json, group_from_json),
}


def record_to_json(table: str, record: object) -> dict[str, object]:
    """A record of ``table`` as the JSON-friendly dict :meth:`DriverState.to_json` holds."""
    return _CODECS[table][0](record)


def record_from_json(table: str, data: Mapping[str, Any]) -> object:
    """Read a record of ``table`` back. Raises :class:`DriverStateError` when malformed."""
    try:
        return _CODECS[table][1](data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DriverStateError(f"malformed {table} record: {exc!r}") from exc


class StateStore(abc.ABC):
    """Where a driver's state lives between calls (and, for some stores, restarts).

    A store that sets ``incremental`` is handed only the records a change touched
    (:meth:`save_records`: one change costs the same whatever the state's size); the
    others get a copy of the whole state (:meth:`save`).
    """

    incremental: ClassVar[bool] = False

    @abc.abstractmethod
    def load(self) -> DriverState:
        """The stored state (empty when nothing was stored). Raises
        :class:`DriverStateError` when what is stored cannot be read."""

    @abc.abstractmethod
    def save(self, state: DriverState) -> None:
        """Store ``state`` (replacing everything stored); when this returns, a later
        :meth:`load` sees it."""

    def save_records(self, records: Sequence[Record]) -> None:
        """Store the changed ``records`` (``(table, key, record or None when removed)``),
        all or none; when this returns, a later :meth:`load` sees them. Only called on an
        ``incremental`` store."""
        raise NotImplementedError(f"{type(self).__name__} stores whole states only")


class MemoryStore(StateStore):
    """Keeps nothing beyond the process: the state starts empty on every load."""

    incremental = True

    def load(self) -> DriverState:
        """A fresh, empty state."""
        return DriverState()

    def save(self, state: DriverState) -> None:
        """Nothing to do: the engine's in-memory state is the only copy."""

    def save_records(self, records: Sequence[Record]) -> None:
        """Nothing to do: the engine's in-memory state is the only copy."""
