"""A deadline for a whole command: every wait and every RPC under it gets what is left.

A command's ``--timeout`` is how long the user is willing to wait for the command, not for
each of its steps: with a driver that accepts connections but never answers, per-step
timeouts (a registration probe, then each CSI call, then the executor waiting for the call
in flight) added up to 121 s for ``--timeout 15``. So the command makes one
:class:`Deadline` at its start and each step asks it for the time left, capped by the step's
own limit::

    deadline = Deadline.after(args.timeout)
    client.node_unpublish_volume(..., timeout=deadline.cap(CSI_TIMEOUT))
"""

from __future__ import annotations

import math
import time

#: The shortest timeout handed out once a deadline has passed: a call then fails at once
#: (gRPC's DEADLINE_EXCEEDED) instead of waiting, or being given no limit by a zero.
EXPIRED_TIMEOUT = 0.001


class Deadline:
    """A point on the monotonic clock; :meth:`never` for no limit. Immutable, thread-safe."""

    __slots__ = ("_at",)

    def __init__(self, at: float) -> None:
        self._at = at

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """``seconds`` from now (None: never)."""
        return cls.never() if seconds is None else cls(time.monotonic() + max(0.0, seconds))

    @classmethod
    def never(cls) -> Deadline:
        """A deadline that never comes: :meth:`cap` returns the step's own limit."""
        return cls(math.inf)

    def remaining(self) -> float:
        """Seconds left (0 once passed, ``inf`` for :meth:`never`)."""
        return max(0.0, self._at - time.monotonic())

    @property
    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return time.monotonic() >= self._at

    def cap(self, seconds: float) -> float:
        """The timeout for a step whose own limit is ``seconds``: the smaller of the two,
        never below :data:`EXPIRED_TIMEOUT`."""
        return max(EXPIRED_TIMEOUT, min(seconds, self.remaining()))

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.3f})"
