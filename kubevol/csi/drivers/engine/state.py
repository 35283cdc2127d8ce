"""A driver's state and where it is kept.

:class:`DriverState` is the one mutable container of records; only the engine changes it,
under its lock, and hands it to a :class:`StateStore` after every change. The mock keeps it
in memory (:class:`MemoryStore`); the hostpath driver writes it to disk atomically
(:class:`kubevol.csi.drivers.hostpath.state.FileStore`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from kubevol.csi.drivers.engine.records import (
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


class DriverState:
    """Volumes, snapshots and group snapshots by id. Not thread-safe: the engine locks."""

    def __init__(self) -> None:
        self.volumes: dict[str, VolumeRecord] = {}
        self.snapshots: dict[str, SnapshotRecord] = {}
        self.groups: dict[str, GroupSnapshotRecord] = {}

    def copy(self) -> DriverState:
        """A copy sharing the (immutable) records."""
        other = DriverState()
        other.volumes = dict(self.volumes)
        other.snapshots = dict(self.snapshots)
        other.groups = dict(self.groups)
        return other

    def _tables(self) -> tuple[dict[str, Any], ...]:
        return (self.volumes, self.snapshots, self.groups)

    def changes_since(self, before: DriverState) -> list[tuple[int, str, object]]:
        """``(table, key, value now)`` for every record added, replaced or removed (value
        ``None``) since ``before``."""
        found: list[tuple[int, str, object]] = []
        for index, (now, then) in enumerate(zip(self._tables(), before._tables(), strict=True)):
            for key in set(now) | set(then):
                if now.get(key) is not then.get(key):
                    found.append((index, key, now.get(key)))
        return found

    def undo(self, before: DriverState, changes: list[tuple[int, str, object]]) -> None:
        """Put back what ``before`` held for each change that nobody changed again since."""
        for index, key, value in changes:
            now, then = self._tables()[index], before._tables()[index]
            if now.get(key) is not value:
                continue
            if key in then:
                now[key] = then[key]
            else:
                now.pop(key, None)

    def volume_by_name(self, name: str) -> VolumeRecord | None:
        """The volume created under ``name``, if any."""
        return next((v for v in self.volumes.values() if v.name == name), None)

    def snapshot_by_name(self, name: str) -> SnapshotRecord | None:
        """The snapshot created under ``name``, if any."""
        return next((s for s in self.snapshots.values() if s.name == name), None)

    def group_by_name(self, name: str) -> GroupSnapshotRecord | None:
        """The group snapshot created under ``name``, if any."""
        return next((g for g in self.groups.values() if g.name == name), None)

    def to_json(self) -> dict[str, Any]:
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


class StateStore(abc.ABC):
    """Where a driver's state lives between calls (and, for some stores, restarts)."""

    @abc.abstractmethod
    def load(self) -> DriverState:
        """The stored state (empty when nothing was stored). Raises
        :class:`DriverStateError` when what is stored cannot be read."""

    @abc.abstractmethod
    def save(self, state: DriverState) -> None:
        """Store ``state``; when this returns, a later :meth:`load` sees it."""


class MemoryStore(StateStore):
    """Keeps nothing beyond the process: the state starts empty on every load."""

    def load(self) -> DriverState:
        """A fresh, empty state."""
        return DriverState()

    def save(self, state: DriverState) -> None:
        """Nothing to do: the engine's in-memory state is the only copy."""
