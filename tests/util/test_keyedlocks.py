"""Covers kubevol.util.keyedlocks.

KeyedLocks: one lock per key, with timeouts, cancellation and no memory for idle keys.
"""

from __future__ import annotations

import threading
import time

import pytest

from kubevol.util.keyedlocks import KeyedLocks


def test_other_keys_are_free_while_one_is_held() -> None:
    """A held key refuses a zero-timeout acquire; another key is granted at once."""
    locks: KeyedLocks[str] = KeyedLocks()
    assert locks.acquire("a")
    assert not locks.acquire("a", timeout=0)
    assert locks.acquire("b", timeout=0)
    assert locks.held() == 2
    locks.release("a")
    locks.release("b")
    assert locks.busy() == 0


def test_timeout_gives_up_and_leaves_no_entry() -> None:
    """A waiter that times out returns False after about its timeout and takes no memory."""
    locks: KeyedLocks[str] = KeyedLocks()
    locks.acquire("k")
    start = time.monotonic()
    assert not locks.acquire("k", timeout=0.2)
    assert time.monotonic() - start >= 0.19
    assert locks.busy() == 1  # the holder only
    locks.release("k")
    assert locks.busy() == 0


def test_cancel_set_before_acquire_gives_up_even_on_a_free_key() -> None:
    """A cancelled waiter gets nothing, even when the key is free."""
    locks: KeyedLocks[str] = KeyedLocks()
    cancel = threading.Event()
    cancel.set()
    assert not locks.acquire("k", cancel=cancel)
    assert locks.busy() == 0


def test_cancel_wakes_a_waiter() -> None:
    """Setting the cancel event ends a wait on a held key within a poll interval or two."""
    locks: KeyedLocks[str] = KeyedLocks()
    locks.acquire("k")
    cancel = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(locks.acquire("k", cancel=cancel)))
    waiter.start()
    time.sleep(0.1)
    cancel.set()
    waiter.join(5)
    assert result == [False]
    locks.release("k")
    assert locks.busy() == 0


def test_release_of_a_key_not_held_is_an_error() -> None:
    """Releasing what nobody holds raises instead of freeing some later holder."""
    locks: KeyedLocks[str] = KeyedLocks()
    with pytest.raises(RuntimeError):
        locks.release("k")


def test_hold_takes_several_keys_in_one_order() -> None:
    """Two threads holding the same keys named in opposite orders never deadlock."""
    locks: KeyedLocks[str] = KeyedLocks()
    done = []

    def work(keys: tuple[str, ...]) -> None:
        for _ in range(200):
            with locks.hold(*keys):
                pass
        done.append(keys)

    threads = [threading.Thread(target=work, args=(k,)) for k in (("x", "y"), ("y", "x"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert len(done) == 2
    assert locks.busy() == 0
