"""The engine's state handling: saved before a call returns, undone when saving fails,
saves shared by concurrent calls; per-key locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from kubevol.csi.drivers.engine import (
    AccessKind,
    DriverState,
    Engine,
    KeyedLocks,
    StateStore,
    VolumeRecord,
)
from kubevol.csi.drivers.engine.state import Record
from kubevol.csi.drivers.mock import MockBackend, MockConfig


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
    inside = 0
    peak = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, peak
        with locks.hold("k"):
            with guard:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.005)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    with locks.hold("other", "z"):
        pass
    for th in threads:
        th.join()
    assert peak == 1
    assert locks._entries == {}


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
