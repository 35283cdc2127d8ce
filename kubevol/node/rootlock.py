"""One writer per kubelet root: an exclusive ``flock`` on ``<root>/kubevol/lock``.

Two commands that change the same root at once each see the other's half-done work as
missing and redo it (two ``kubevol up`` runs stacked duplicate mounts). So every command
that changes a root, and the agent for its whole lifetime, holds :class:`RootLock`::

    with RootLock(root, timeout=30, on_wait=print):
        ...  # mount, unmount, repair

The lock is the kernel's: it goes with the process, however it ends (``kill -9`` included),
so a stale lock file never blocks anyone. The file holds the holder's PID, for the message
of whoever waits. Read-only commands (``status``, ``reconstruct`` without ``--repair``) do
not take it: they must work while an agent runs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable
from typing import Self

from kubevol.errors import KubevolError
from kubevol.layout import make_data_dirs
from kubevol.node.records import STATE_DIR

#: The lock file in kubevol's own directory under the root.
LOCK_FILE = "lock"

#: How often a waiter tries again.
POLL_INTERVAL = 0.05


class RootBusyError(KubevolError, TimeoutError):
    """The root stayed locked by another process for longer than the caller would wait."""


class RootWaitStopped(KubevolError, InterruptedError):
    """The wait for the root was given up because the holder's ``stop`` was set (the
    agent's SIGTERM or SIGINT): nothing was done."""


def lock_path(root_dir: str) -> str:
    """``<root>/kubevol/lock``."""
    return os.path.join(root_dir, STATE_DIR, LOCK_FILE)


class RootLock:
    """An exclusive lock on a kubelet root, for as long as it is held (a context manager).

    ``timeout`` is how long :meth:`acquire` waits for another holder (None: as long as it
    takes, 0: not at all); ``on_wait`` is told once, in one line, who holds it when waiting
    starts; setting ``stop`` (a signal handler does) ends the wait at once with
    :class:`RootWaitStopped`. Not re-entrant; one object per holder.
    """

    def __init__(
        self,
        root_dir: str,
        *,
        timeout: float | None = None,
        on_wait: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.root_dir = root_dir
        self.stop = stop
        self.path = lock_path(root_dir)
        self.timeout = timeout
        self.on_wait = on_wait
        self._fd = -1

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd >= 0

    def acquire(self) -> Self:
        """Take the lock, waiting up to ``timeout``. Raises :class:`RootBusyError` when it
        stays held, :class:`RootWaitStopped` when ``stop`` is set while waiting,
        :class:`~kubevol.errors.KubevolError` when the lock file cannot be made
        (a root that is not a directory, a read-only file system...)."""
        if self.held:
            raise KubevolError(f"the lock on {self.root_dir} is already held by this object")
        fd = self._open()
        try:
            self._wait_for(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Let go of the lock. Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _open(self) -> int:
        directory = os.path.dirname(self.path)
        try:
            # Every writer takes this lock first: the root is made here, 0750 as the
            # kubelet makes it, and kubevol's own directory 0700.
            make_data_dirs(self.root_dir, STATE_DIR, mode=0o700)
            return os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except (FileExistsError, NotADirectoryError) as exc:  # a file where a directory belongs
            raise KubevolError(
                f"cannot lock root {self.root_dir}: "
                f"{directory if exc.filename in (None, self.path) else exc.filename} is not a "
                "directory"
            ) from exc
        except OSError as exc:
            raise KubevolError(
                f"cannot lock root {self.root_dir}: {self.path}: {exc.strerror}"
            ) from exc

    def _wait_for(self, fd: int) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise KubevolError(
                        f"cannot lock root {self.root_dir}: {exc.strerror}"
                    ) from exc
            holder = _holder(fd)
            if not told and self.on_wait is not None and self.timeout != 0:
                self.on_wait(f"waiting for root {self.root_dir}, in use by {holder}")
                told = True
            if deadline is not None and time.monotonic() >= deadline:
                raise RootBusyError(
                    f"root {self.root_dir} is in use by {holder} (another kubevol command "
                    f"or agent); gave up after {self.timeout:g} s"
                )
            pause = POLL_INTERVAL
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            if self.stop is None:
                time.sleep(pause)
            elif self.stop.wait(pause):
                raise RootWaitStopped(
                    f"stopped while waiting for root {self.root_dir} (in use by {holder})")


def _holder(fd: int) -> str:
    try:
        pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return "another process"
    return f"process {pid}"
