"""Turns at local work: one operation thread at a time runs its Python and file-system calls.

The node's operations run on several threads so that one waiting on something outside the
process (a CSI driver's answer, a mount helper) does not hold up the others. Their local
work cannot run in parallel anyway: one thread at a time runs Python (the GIL), and every
system call lets go of it. When several threads want it at once, each system call hands it
to a sleeping thread and the caller sleeps until it comes back: two context switches for a
call of microseconds (a ``kubevol down`` of 500 pods made four times the context switches
and used a third more CPU without turns: benchmarks/README.md).

So an operation runs in its thread's turn (:meth:`Turns.take`), and gives the turn up while
it waits on another process (:func:`given_up`): the threads waiting for a turn sleep on
it, not on the GIL, and are woken once per turn instead of once per system call. The node
layer installs :func:`given_up` where the waits are: its CSI clients' ``around_call`` and
its mounter's ``around_helper`` (the client and the mount layer know no scheduler).

A turn is advisory: a thread that waited ``patience`` seconds goes on without it. A call
that blocks without giving the turn up (a hung NFS mount, a slow API server) therefore
slows the other operations down by at most that much each, and never stops them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

#: Seconds a thread waits for its turn before it goes on without it. Far above a turn's
#: usual length (an operation's local work: a millisecond or two), far below anything a
#: user would notice if a call that blocks forgot to give its turn up.
PATIENCE = 0.02


class _ThreadTurn(threading.local):
    """What the current thread holds: the turns it takes part in, and whether it has one."""

    turns: Turns | None = None
    holding = False


_current = _ThreadTurn()


class Turns:
    """One turn, passed between the threads that :meth:`take` it. Thread-safe.

    ``patience``: seconds a thread waits for the turn (default :data:`PATIENCE`).
    """

    def __init__(self, *, patience: float | None = None) -> None:
        self.patience = PATIENCE if patience is None else patience
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def take(self) -> Iterator[None]:
        """Run the body in the calling thread's turn: after the thread holding it lets go,
        or after :attr:`patience` seconds without it. A thread already taking part in turns
        just runs the body."""
        if _current.turns is not None:
            yield
            return
        _current.turns = self
        self._wait()
        try:
            yield
        finally:
            self._let_go()
            _current.turns = None

    def _wait(self) -> None:
        _current.holding = self._lock.acquire(timeout=self.patience)

    def _let_go(self) -> None:
        if _current.holding:
            _current.holding = False
            self._lock.release()


@contextlib.contextmanager
def given_up() -> Iterator[None]:
    """Around a wait on another process (an RPC, a helper): the calling thread's turn goes
    to another thread meanwhile, and is waited for again afterwards. Nothing happens in a
    thread that takes no turns."""
    turns = _current.turns
    if turns is None:
        yield
        return
    turns._let_go()
    try:
        yield
    finally:
        turns._wait()
