"""The hostpath driver's state on disk: one JSON file replaced atomically, and a lock that
keeps two driver processes off the same state directory."""

from __future__ import annotations

import fcntl
import json
import os

from kubevol.csi.drivers.engine.state import DriverState, DriverStateError, StateStore
from kubevol.layout import write_json_atomically

STATE_FILE = "state.json"
LOCK_FILE = ".lock"


class FileStore(StateStore):
    """Keeps the state in ``<directory>/state.json``.

    :meth:`save` writes a temporary file in the same directory, flushes it to disk, renames
    it over the old file and flushes the directory: a crash at any point leaves either the
    old state or the new one, never a mix. The file is readable by root only (mode 0600).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, STATE_FILE)

    def load(self) -> DriverState:
        """The stored state; empty when there is no file yet. Raises
        :class:`~kubevol.csi.drivers.engine.state.DriverStateError` naming the file when it
        cannot be parsed."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return DriverState()
        except (OSError, ValueError) as exc:
            raise DriverStateError(f"cannot read driver state {self.path}: {exc}") from exc
        if not isinstance(data, dict):
            raise DriverStateError(f"driver state {self.path} is not a JSON object")
        try:
            return DriverState.from_json(data)
        except DriverStateError as exc:
            raise DriverStateError(f"{self.path}: {exc}") from exc

    def save(self, state: DriverState) -> None:
        """Replace the file atomically with ``state`` (see the class docstring)."""
        write_json_atomically(self.path, state.to_json())


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
