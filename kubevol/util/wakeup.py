"""A pipe that wakes a thread sleeping in ``select`` (or a selector) beside its other
descriptors, so that it needs no timeout to look at a flag: on the machines kubevol runs on
each wake-up of an idle thread costs ~0.1 ms of CPU."""

from __future__ import annotations

import contextlib
import os


class WakePipe:
    """Readable once :meth:`poke` was called (from any thread), until :meth:`drain`. Wait on
    it as on a socket (it has :meth:`fileno`). Close it when done (idempotent)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        """The end a waiter watches (-1 once closed)."""
        return self._read

    def poke(self) -> None:
        """Make the pipe readable; never blocks."""
        with contextlib.suppress(OSError):  # full (readable already) or closed
            os.write(self._write, b"!")

    def drain(self) -> None:
        """Take the pokes so far: the pipe is not readable until the next one."""
        with contextlib.suppress(OSError):  # nothing to read, or closed
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        """Close both ends. Idempotent."""
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._read = self._write = -1
