"""Covers kubevol.csidriver.drivers.engine.

The engine's state handling: saved before a call returns, undone when saving fails,
saves shared by concurrent calls; per-key locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from kubevol.csidriver.drivers.engine import (
    AccessKind,
    DriverState,
    Engine,
    KeyedLocks,
    StateStore,
    VolumeRecord,
)
from kubevol.csidriver.drivers.engine.state import Record
from kubevol.csidriver.drivers.mock import MockBackend, MockConfig
from kubevol.testing.overlap import Overlap


class FlakyStore(StateStore):
    """An incremental store that keeps what it is given in a state of its own, counts saves
    and the records each carried, fails them on demand, and makes each take a while."""

    incremental = True

    def __init__(self) -> None:
        self.saves = 0
        self.fail = False
        self.saved = DriverState()
        self.batches: list[list[tuple[str, str]]] = []

    def load(self) -> DriverState:
        return DriverState()

    def save(self, state: DriverState) -> None:
        raise AssertionError("an incremental store is never handed the whole state")

    def save_records(self, records: Sequence[Record]) -> None:
        time.sleep(0.01)
        if self.fail:
            raise OSError("disk full")
        self.saves += 1
        self.batches.append([(table, key) for table, key, _ in records])
        for table, key, value in records:
            if value is None:
                self.saved.table(table).pop(key, None)
            else:
                self.saved.table(table)[key] = value


def record(vid: str) -> VolumeRecord:
    """A minimal volume record."""
    return VolumeRecord(volume_id=vid, name=vid, capacity_bytes=1, kind=AccessKind.MOUNT)


def engine_with(store: FlakyStore) -> Engine:
    """An engine over the mock backend and ``store``."""
    return Engine(MockConfig(node_id="n").settings(), MockBackend(False), store)


def test_failed_save_undoes_the_change() -> None:
    """When the store fails, the call raises and the record is not kept in memory."""
    store = FlakyStore()
    engine = engine_with(store)
    engine.put_volume(record("a"))
    store.fail = True
    with pytest.raises(OSError, match="disk full"):
        engine.put_volume(record("b"))
    with pytest.raises(OSError):
        engine.drop_volume("a")
    assert [v.volume_id for v in engine.volumes()] == ["a"]
    assert list(store.saved.volumes) == ["a"]


def test_concurrent_commits_share_saves() -> None:
    """Sixteen concurrent changes are all saved, with fewer writes than changes."""
    store = FlakyStore()
    engine = engine_with(store)
    threads = [
        threading.Thread(target=engine.put_volume, args=(record(f"v{i}"),)) for i in range(16)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(store.saved.volumes) == 16
    assert store.saves < 16


def test_keyed_locks_serialise_one_key_only() -> None:
    """Holders of one key run one at a time; another key is not blocked; entries go away."""
    locks: KeyedLocks[str] = KeyedLocks()
    overlap = Overlap()

    def work() -> None:
        with locks.hold("k"), overlap:
            time.sleep(0.005)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    with locks.hold("other", "z"):
        pass
    for th in threads:
        th.join()
    assert overlap.peak == 1
    assert locks._entries == {}


@pytest.mark.slow
def test_a_change_saves_only_its_records() -> None:
    """With 500 volumes stored, creating one and removing another hands the store one
    record each: the cost of a change does not grow with the state."""
    store = FlakyStore()
    engine = engine_with(store)
    for i in range(500):
        engine.put_volume(record(f"v{i}"))
    store.batches.clear()
    engine.put_volume(record("new"))
    engine.drop_volume("v7")
    assert store.batches == [[("volumes", "new")], [("volumes", "v7")]]
    assert "v7" not in store.saved.volumes and "new" in store.saved.volumes


def test_a_call_that_fails_midway_leaves_no_change() -> None:
    """A commit function that raises after changing the state leaves it as it was."""
    store = FlakyStore()
    engine = engine_with(store)
    engine.put_volume(record("a"))

    def half_done(state: DriverState) -> None:
        state.volumes["b"] = record("b")
        del state.volumes["a"]
        raise ValueError("changed my mind")

    with pytest.raises(ValueError):
        engine.commit(half_done)
    assert [v.volume_id for v in engine.volumes()] == ["a"]
    assert store.saves == 1


def named(vid: str, name: str, size: int) -> VolumeRecord:
    """A volume record with its own name and size."""
    return VolumeRecord(volume_id=vid, name=name, capacity_bytes=size, kind=AccessKind.MOUNT)


def scanned(state: DriverState) -> tuple[dict[str, str], int]:
    """Name -> id and the capacity summed by walking every volume (what the index saves)."""
    return {v.name: k for k, v in state.volumes.items()}, sum(
        v.capacity_bytes for v in state.volumes.values()
    )


def indexed(state: DriverState, names: Sequence[str]) -> tuple[dict[str, str], int]:
    """The same, answered by the state's lookups."""
    found = {n: v.volume_id for n in names if (v := state.volume_by_name(n)) is not None}
    return found, state.capacity_bytes()


def test_lookup_by_name_and_capacity_follow_every_change() -> None:
    """Volume lookups by name and the capacity in use stay what a walk over every volume
    says through adds, replacements (renamed, resized), removals in each dict form, a failed
    commit's undo, a copy and a failed save."""
    store = FlakyStore()
    engine = engine_with(store)
    names = [f"n{i}" for i in range(8)] + ["renamed", "gone"]
    for i in range(6):
        engine.put_volume(named(f"v{i}", f"n{i}", 10 + i))
    engine.put_volume(named("v1", "renamed", 100))  # replaced under another name and size
    engine.drop_volume("v2")

    def several(state: DriverState) -> None:
        state.volumes.pop("v3")
        del state.volumes["v4"]
        state.volumes.update({"v6": named("v6", "n6", 7)})
        state.volumes.setdefault("v7", named("v7", "n7", 5))

    engine.commit(several)

    def fails(state: DriverState) -> None:
        state.volumes["v8"] = named("v8", "gone", 1000)
        state.volumes.pop("v0")
        state.volumes["v5"] = named("v5", "gone", 3)
        raise ValueError("undo me")

    with pytest.raises(ValueError):
        engine.commit(fails)
    store.fail = True
    with pytest.raises(OSError):
        engine.put_volume(named("v9", "gone", 1))
    state = engine.read(lambda s: s.copy())
    for each in (state, engine.read(lambda s: s)):
        assert indexed(each, names) == scanned(each)
    assert scanned(state) == ({"n0": "v0", "renamed": "v1", "n5": "v5", "n6": "v6", "n7": "v7"},
                              10 + 100 + 15 + 7 + 5)  # fmt: skip
    assert engine.used_bytes() == 137
    assert state.volume_by_name("gone") is None and state.volume_by_name("n3") is None


def test_lookup_by_name_does_not_walk_the_volumes() -> None:
    """With 20,000 volumes, a lookup by name (each CreateVolume makes one) and the capacity
    in use (each creation's reservation) read no volume record: they cost the same as with
    ten. A table that counts its reads would see a walk."""
    state = DriverState()
    for i in range(20_000):
        state.volumes[f"v{i}"] = named(f"v{i}", f"n{i}", 1)

    reads = 0
    real_values = type(state.volumes).values

    def counting_values(self: dict[str, VolumeRecord]) -> object:
        nonlocal reads
        reads += 1
        return real_values(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(state.volumes), "values", counting_values)
        assert state.volume_by_name("n19999") == state.volumes["v19999"]
        assert state.volume_by_name("absent") is None
        assert state.capacity_bytes() == 20_000
    assert reads == 0
