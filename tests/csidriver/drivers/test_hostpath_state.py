"""Covers kubevol.csidriver.drivers.hostpath.state.

The hostpath driver's SQLite state: every acknowledged change survives kill -9 at any
instant, a change writes only its records, an older driver's state.json is taken over."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kubevol.csidriver.drivers.engine import AccessKind, DriverState, DriverStateError, VolumeRecord
from kubevol.csidriver.drivers.hostpath.state import DB_FILE, LEGACY_STATE_FILE, SqliteStore


def record(vid: str, size: int = 1) -> VolumeRecord:
    """A minimal volume record."""
    return VolumeRecord(volume_id=vid, name=vid, capacity_bytes=size, kind=AccessKind.MOUNT)


#: A writer that saves one volume per transaction and prints each id once saved_records
#: returned (the driver's "done").
WRITER = textwrap.dedent(
    """
    import sys
    from kubevol.csidriver.drivers.engine import AccessKind, VolumeRecord
    from kubevol.csidriver.drivers.hostpath.state import SqliteStore
    store = SqliteStore(sys.argv[1])
    store.load()
    i = int(sys.argv[2])
    while True:
        vid = f"v{i}"
        rec = VolumeRecord(volume_id=vid, name=vid, capacity_bytes=i, kind=AccessKind.MOUNT)
        gone = [("volumes", f"v{i - 5}", None)] if i >= 5 else []
        store.save_records([("volumes", vid, rec), *gone])
        print(vid, flush=True)
        i += 1
    """
)


@pytest.mark.slow
def test_every_acknowledged_change_survives_sigkill(tmp_path: Path) -> None:
    """A writer killed with SIGKILL at random instants, twenty times over: the state always
    loads, holds every change the writer acknowledged and nothing half-written."""
    rng = random.Random(7)
    acknowledged: list[int] = []
    next_id = 0
    for _ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(next_id)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # running: at least one transaction done
        assert first.startswith("v")
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate()
        acknowledged += [int(line[1:]) for line in [first, *rest.splitlines()]]
        store = SqliteStore(str(tmp_path))
        volumes = store.load().volumes
        store.close()
        # Each transaction adds v<i> and removes v<i-5>: the newest stored is the last
        # acknowledged (or the one after it: done, killed before it printed), and the
        # state is exactly the five transactions up to it, each one whole.
        top = max(int(v[1:]) for v in volumes)
        assert top in (max(acknowledged), max(acknowledged) + 1)
        assert set(volumes) == {f"v{i}" for i in range(max(0, top - 4), top + 1)}
        assert all(v.capacity_bytes == int(v.volume_id[1:]) for v in volumes.values())
        next_id = top + 1


def test_files_are_private(tmp_path: Path) -> None:
    """The database (and SQLite's journal files, which take its mode) are root-only."""
    store = SqliteStore(str(tmp_path))
    store.save_records([("volumes", "a", record("a"))])
    assert stat.S_IMODE(os.stat(tmp_path / DB_FILE).st_mode) == 0o600
    for leftover in tmp_path.glob(f"{DB_FILE}-*"):
        assert stat.S_IMODE(leftover.stat().st_mode) == 0o600
    store.close()


def test_older_drivers_state_json_is_taken_over(tmp_path: Path) -> None:
    """A state directory of a driver that kept state.json: its records move into the
    database on first use, and the JSON file goes."""
    old = DriverState()
    old.volumes["kept"] = record("kept", 42)
    (tmp_path / LEGACY_STATE_FILE).write_text(json.dumps(old.to_json()))
    store = SqliteStore(str(tmp_path))
    assert store.load().volumes["kept"].capacity_bytes == 42
    assert not (tmp_path / LEGACY_STATE_FILE).exists()
    store.save_records([("volumes", "new", record("new"))])
    store.close()
    again = SqliteStore(str(tmp_path))
    assert set(again.load().volumes) == {"kept", "new"}
    again.close()


def test_migration_interrupted_after_its_commit_keeps_the_database(tmp_path: Path) -> None:
    """A state.json left by a run that died after migrating (before removing the file) is
    not read again: the database, which has moved on since, is the truth."""
    old = DriverState()
    old.volumes["kept"] = record("kept")
    (tmp_path / LEGACY_STATE_FILE).write_text(json.dumps(old.to_json()))
    store = SqliteStore(str(tmp_path))
    store.load()
    store.save_records([("volumes", "kept", None)])
    store.close()
    (tmp_path / LEGACY_STATE_FILE).write_text(json.dumps(old.to_json()))
    store = SqliteStore(str(tmp_path))
    assert store.load().volumes == {}
    assert not (tmp_path / LEGACY_STATE_FILE).exists()
    store.close()


@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero", "deep-json"])
def test_a_hostile_legacy_state_json_is_one_clear_error(tmp_path: Path, kind: str) -> None:
    """An older driver's state.json is read as untrusted: a FIFO (an open for reading would
    block forever), a link to /dev/zero (a read never ends) or JSON nested 100,000 deep
    (RecursionError) is refused with an error naming the file, at once, and left in place."""
    legacy = tmp_path / LEGACY_STATE_FILE
    if kind == "fifo":
        os.mkfifo(legacy)
    elif kind == "link-to-dev-zero":
        legacy.symlink_to("/dev/zero")
    else:
        legacy.write_text("[" * 100_000 + "]" * 100_000)
    store = SqliteStore(str(tmp_path))
    started = time.monotonic()
    with pytest.raises(DriverStateError, match=LEGACY_STATE_FILE):
        store.load()
    assert time.monotonic() - started < 5
    assert os.path.lexists(legacy)
    store.close()


def test_an_edited_record_nested_without_bound_is_one_clear_error(tmp_path: Path) -> None:
    """A record in the database edited to JSON nested 100,000 deep is refused naming the
    record, not a RecursionError."""
    store = SqliteStore(str(tmp_path))
    store.save_records([("volumes", "v1", record("v1"))])
    store.close()
    db = sqlite3.connect(tmp_path / DB_FILE)
    db.execute("UPDATE records SET data = ? WHERE id = 'v1'", ("[" * 100_000 + "]" * 100_000,))
    db.commit()
    db.close()
    store = SqliteStore(str(tmp_path))
    with pytest.raises(DriverStateError, match=r"v1.*nests deeper"):
        store.load()
    store.close()


def test_any_parameter_text_round_trips(tmp_path: Path) -> None:
    """Records are kept as JSON text whatever their strings hold: non-ASCII, and a lone
    surrogate (which the C encoder refuses and the fallback escapes) come back unchanged."""
    store = SqliteStore(str(tmp_path))
    odd = {"snow": "\u2603 né", "lone": "x\udcff", "empty": ""}
    rec = VolumeRecord(
        volume_id="v1", name="n", capacity_bytes=1 << 62, kind=AccessKind.MOUNT, parameters=odd
    )
    store.save_records([("volumes", "v1", rec)])
    store.close()
    store = SqliteStore(str(tmp_path))
    assert store.load().volumes == {"v1": rec}
    store.close()
