"""The hostpath driver's state on disk: one SQLite row per record, and a lock that keeps two
driver processes off the same state directory.

Why SQLite: a change must cost the same with 10 volumes as with 2,000 (rewriting one JSON
file of the whole state grew with the state: benchmarks/README.md), and must survive
``kill -9`` at any instant. SQLite writes the changed rows in one transaction to its
write-ahead log before the commit returns, so a crash of the driver leaves the state
before or after the change, never a mix, and never loses a change the driver reported done.

Durability, decided: ``synchronous=NORMAL`` (write-ahead log mode). The log is written
(``write(2)``, into the page cache) on every commit and fsynced only at checkpoints, so:

- a crash of the driver process (SIGKILL, OOM kill, a bug) at any instant loses nothing
  it acknowledged: the kernel keeps what was written, and SQLite recovers the log;
- a power loss or kernel crash can lose the last acknowledged changes (those since the
  last checkpoint), never half a change, never the database: it opens at an earlier,
  consistent state.

``synchronous=FULL`` closed that window with an fsync per commit: six per volume
lifecycle, most of the driver's time per call (py-spy: 60% of the RPC handlers' samples
with one client, mostly waiting on the fsync). The window is acceptable here because a
power loss also undoes what the records describe on the node side (bind mounts do not
survive a reboot; a CO stages and publishes again), and the upstream
kubernetes-csi/csi-driver-host-path keeps its state file with a plain write and no fsync at
all (pkg/state/state.go), which neither survives a power loss nor is atomic. What a lost
controller-side change can leave after a power loss: a volume directory without its record
(CreateVolume lost; a CO retrying the creation by name gets a new one), or a record
whose directory is gone (DeleteVolume lost; the CO's retried DeleteVolume removes it).

A state directory written by an older driver (``state.json``) is taken over on first use:
its records are copied into the database in one transaction that also notes the migration,
then the JSON file is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence

from kubevol.csidriver.drivers.engine.state import (
    TABLES,
    DriverState,
    DriverStateError,
    Record,
    StateStore,
    record_from_json,
    record_to_json,
)
from kubevol.util import jsontext
from kubevol.util.safeio import load_json_file, parse_json

DB_FILE = "state.db"
#: What drivers before the SQLite store kept (migrated on first use).
LEGACY_STATE_FILE = "state.json"
LOCK_FILE = ".lock"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS records ("
    " kind TEXT NOT NULL, id TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (kind, id)"
    ") WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


class SqliteStore(StateStore):
    """Keeps the state in ``<directory>/state.db`` (see the module docstring). The files are
    readable by root only (mode 0600). Close it when done (the driver does)."""

    incremental = True

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, DB_FILE)
        self.legacy_path = os.path.join(directory, LEGACY_STATE_FILE)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def load(self) -> DriverState:
        """The stored state; empty when nothing was stored yet. Raises
        :class:`~kubevol.csidriver.drivers.engine.state.DriverStateError` naming the file when it
        cannot be read."""
        with self._lock:
            try:
                db = self._connect()
                self._migrate_legacy(db)
                rows = db.execute("SELECT kind, id, data FROM records").fetchall()
            except sqlite3.Error as exc:
                raise DriverStateError(f"cannot read driver state {self.path}: {exc}") from exc
        state = DriverState()
        for kind, key, data in rows:
            if kind not in TABLES:
                raise DriverStateError(f"{self.path}: unknown record kind {kind!r}")
            try:
                # Through safeio: an edited database may hold JSON nested without bound.
                parsed = parse_json(
                    data.encode() if isinstance(data, str) else data, f"{kind} {key!r}"
                )
            except ValueError as exc:
                raise DriverStateError(f"{self.path}: {exc}") from exc
            if not isinstance(parsed, dict):
                raise DriverStateError(f"{self.path}: {kind} {key!r} is not a JSON object")
            try:
                record = record_from_json(kind, parsed)
            except DriverStateError as exc:
                raise DriverStateError(f"{self.path}: {kind} {key!r}: {exc}") from exc
            state.table(kind)[key] = record
        return state

    def save_records(self, records: Sequence[Record]) -> None:
        """Write the changed records in one transaction (a removed record: its row goes)."""
        rows = [(k, key, _encode(k, rec)) for k, key, rec in records if rec is not None]
        gone = [(k, key) for k, key, rec in records if rec is None]
        with self._lock:
            db = self._connect()
            with _transaction(db):
                db.executemany("INSERT OR REPLACE INTO records VALUES (?, ?, ?)", rows)
                db.executemany("DELETE FROM records WHERE kind = ? AND id = ?", gone)

    def save(self, state: DriverState) -> None:
        """Replace everything stored with ``state``, in one transaction."""
        with self._lock:
            db = self._connect()
            with _transaction(db):
                _replace_all(db, state)

    def close(self) -> None:
        """Close the database. Idempotent; the store reopens it when used again."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            # Create the file ourselves so that it (and SQLite's -wal and -shm files, which
            # take its mode) is private from the start.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                # Survives kill -9 at any point, not power loss of the last commits: see
                # the module docstring (a deliberate choice).
                db.execute("PRAGMA synchronous=NORMAL")
                for statement in _SCHEMA:
                    db.execute(statement)
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _migrate_legacy(self, db: sqlite3.Connection) -> None:
        if not os.path.exists(self.legacy_path):
            return
        done = db.execute("SELECT value FROM meta WHERE key = 'migrated'").fetchone()
        if done is None:
            state = _load_legacy(self.legacy_path)
            with _transaction(db):
                _replace_all(db, state)
                db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('migrated', ?)", (self.legacy_path,)
                )
        # Migrated now or by a run that died before removing it: the database has it all.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.legacy_path)


def _encode(kind: str, record: object) -> str:
    # In C: json.dumps was ~4% of the driver's Python time, one record per change.
    return jsontext.dumps(record_to_json(kind, record), sort_keys=True)


def _replace_all(db: sqlite3.Connection, state: DriverState) -> None:
    db.execute("DELETE FROM records")
    db.executemany(
        "INSERT INTO records VALUES (?, ?, ?)",
        [
            (kind, key, _encode(kind, record))
            for kind in TABLES
            for key, record in state.table(kind).items()
        ],
    )


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _load_legacy(path: str) -> DriverState:
    try:  # a file an older driver left, so read as untrusted (no link, FIFO, size cap)
        data = load_json_file(path)
    except (OSError, ValueError) as exc:
        raise DriverStateError(f"cannot read driver state {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise DriverStateError(f"driver state {path} is not a JSON object")
    try:
        return DriverState.from_json(data)
    except DriverStateError as exc:
        raise DriverStateError(f"{path}: {exc}") from exc


class StateDirLock:
    """An exclusive ``flock`` on ``<directory>/.lock`` for as long as a driver uses it."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock; raises :class:`DriverStateError` when another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DriverStateError(
                f"state directory {os.path.dirname(self.path)} is in use by another driver"
            ) from None
        self._fd = fd

    def release(self) -> None:
        """Drop the lock. Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
