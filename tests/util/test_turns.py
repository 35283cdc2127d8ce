"""Turns at local work (kubevol.util.turns): one thread at a time, given up around waits, never
waited for longer than the patience."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kubevol.testing.overlap import Overlap
from kubevol.util.turns import Turns, given_up


def _threads(count: int, body: Callable[[], None]) -> None:
    threads = [threading.Thread(target=body) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()


def test_threads_taking_turns_run_one_at_a_time() -> None:
    """Each body blocks for a while without giving its turn up: no other body runs then."""
    turns, inside = Turns(patience=30), Overlap()

    def body() -> None:
        with turns.take(), inside:
            time.sleep(0.02)

    _threads(4, body)
    assert inside.entries == 4
    assert inside.peak == 1


def test_a_turn_given_up_goes_to_another_thread() -> None:
    """A thread waiting (given up) on what another thread does in its turn: without the turn
    given up, the other thread would wait the whole patience (30 s)."""
    turns, done = Turns(patience=30), threading.Event()
    waited: list[float] = []

    def waiter() -> None:
        with turns.take():
            started = time.monotonic()
            with given_up():
                assert done.wait(10)
            waited.append(time.monotonic() - started)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.05)  # the waiter holds the turn, then gives it up
    with turns.take():
        done.set()
    thread.join(15)
    assert waited and waited[0] < 5


def test_a_thread_keeping_its_turn_does_not_stop_the_others() -> None:
    """A turn held through a blocking call (a hung mount) costs another thread the patience,
    not the whole wait."""
    turns, hung, release = Turns(patience=0.05), threading.Event(), threading.Event()

    def hanging() -> None:
        with turns.take():
            hung.set()
            release.wait(10)

    thread = threading.Thread(target=hanging)
    thread.start()
    assert hung.wait(5)
    started = time.monotonic()
    with turns.take():
        pass
    took = time.monotonic() - started
    release.set()
    thread.join(5)
    assert 0.04 < took < 5


def test_a_thread_in_its_turn_takes_no_second_one() -> None:
    """Taking turns again inside a turn runs at once (it would wait the patience, 30 s, on
    its own turn otherwise); the turn is let go only by the outer exit."""
    turns = Turns(patience=30)
    started = time.monotonic()
    with turns.take():
        with turns.take():
            pass
        with given_up():
            pass
    with turns.take():
        pass
    assert time.monotonic() - started < 5

