"""Mount churn for tests: a thread that mounts and unmounts tmpfs in a loop, as containers
starting and stopping do to a busy node's mount table.

Use it around code that reads the mount table or mounts and unmounts itself::

    with MountChurn(tmp_path / "churn") as churn:
        run_a_driver_lifecycle()
    assert churn.cycles > 0

Run as root in a private mount namespace. Everything it mounted is unmounted when it stops.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Self

from kubevol.mount import syscalls
from kubevol.util.lifecycle import RunsWhileEntered


class MountChurn(RunsWhileEntered):
    """Mounts and unmounts tmpfs at ``slots`` directories under ``base`` until stopped: as
    fast as it can (mount(2) directly: thousands of changes a second), or resting
    ``pause`` seconds after each round. ``cycles`` counts rounds; an error in the thread is
    re-raised by :meth:`stop`."""

    def __init__(self, base: Path, *, slots: int = 4, pause: float = 0.0) -> None:
        self.base = base
        self.pause = pause
        self.cycles = 0
        self._points = [str(base / f"churn-{i}") for i in range(slots)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> Self:
        """Create the directories and start the thread."""
        for point in self._points:
            os.makedirs(point, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="mount-churn", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and unmount what it left. Idempotent; re-raises its error."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for point in self._points:
            while os.path.isdir(point) and syscalls.umount(point, syscalls.MNT_DETACH):
                pass
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for point in self._points:
                    syscalls.mount("churn", point, "tmpfs", 0, "size=64k")
                for point in self._points:
                    syscalls.umount(point)
                self.cycles += 1
                if self.pause:
                    self._stop.wait(self.pause)
        except BaseException as exc:  # handed to stop(), which re-raises it
            self._error = exc
