"""Covers kubevol.node.executor.

The operation executor: one operation per key with wildcards, refusal, backoff.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from kubevol.errors import TransientOperationError
from kubevol.node.errors import OperationBackoffError, OperationPendingError
from kubevol.node.executor import (
    MAX_BACKOFF,
    OperationExecutor,
    OperationKey,
    OperationKind,
)
from kubevol.testing.overlap import Overlap
from kubevol.testing.waiting import wait_until
from kubevol.util import turns


class Clock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail() -> None:
    raise TransientOperationError("boom")


def ok() -> None:
    pass


def blocker() -> tuple[threading.Event, threading.Event, Callable[[], None]]:
    started, release = threading.Event(), threading.Event()

    def op() -> None:
        started.set()
        release.wait(10)

    return started, release, op


def running_blockers(
    executor: OperationExecutor, count: int
) -> list[tuple[threading.Event, threading.Event, Callable[[], None]]]:
    """``count`` blocking operations (volumes v0, v1, ...) started on ``executor``, each
    running once this returns; set an operation's release event to end it."""
    ops = [blocker() for _ in range(count)]
    for i, (_, _, op) in enumerate(ops):
        executor.run(OperationKey(volume=f"v{i}"), OperationKind.UNMOUNT_DEVICE, op)
    for started, _, _ in ops:
        assert started.wait(5)
    return ops


@pytest.mark.parametrize(
    ("running", "asked", "conflict"),
    [
        (OperationKey(volume="v"), OperationKey(volume="v", pod="p1"), True),
        (OperationKey(volume="v", pod="p1"), OperationKey(volume="v"), True),
        (OperationKey(volume="v", pod="p1"), OperationKey(volume="v", pod="p2"), False),
        (OperationKey(volume="v", pod="p1"), OperationKey(volume="v", pod="p1"), True),
        (OperationKey(volume="v", node="n1"), OperationKey(volume="v", node="n2"), False),
        (OperationKey(volume="v", node="n1"), OperationKey(volume="v"), True),
        (OperationKey(volume="v"), OperationKey(volume="w"), False),
    ],
)
def test_wildcard_rules(running: OperationKey, asked: OperationKey, conflict: bool) -> None:
    """An empty pod or node matches any; other fields must be equal to conflict."""
    executor = OperationExecutor(workers=2)
    started, release, op = blocker()
    executor.run(running, OperationKind.MOUNT_DEVICE, op)
    assert started.wait(5)
    try:
        if conflict:
            with pytest.raises(OperationPendingError) as info:
                executor.run(asked, OperationKind.SET_UP, ok)
            assert info.value.key == running
        else:
            executor.run(asked, OperationKind.SET_UP, ok).result(5)
    finally:
        release.set()
        executor.shutdown()


def test_concurrent_runs_on_one_key_start_exactly_one() -> None:
    """Many threads asking for one key at once: one runs, all others are refused."""
    executor = OperationExecutor(workers=4)
    _, release, op = blocker()
    results: list[str] = []
    lock = threading.Lock()

    def ask() -> None:
        try:
            executor.run(OperationKey(volume="v"), OperationKind.SET_UP, op)
            outcome = "started"
        except OperationPendingError:
            outcome = "refused"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    release.set()
    executor.shutdown()
    assert results.count("started") == 1
    assert results.count("refused") == 15


def test_backoff_doubles_and_is_capped() -> None:
    """After each failure the same operation waits 0.5 s, 1 s, 2 s ... at most 2 min 2 s."""
    clock = Clock()
    executor = OperationExecutor(workers=0, clock=clock)
    key = OperationKey(volume="v")
    expected = 0.5
    for _ in range(12):
        executor.run(key, OperationKind.MOUNT_DEVICE, fail)
        with pytest.raises(OperationBackoffError) as info:
            executor.run(key, OperationKind.MOUNT_DEVICE, fail)
        assert info.value.retry_in == pytest.approx(expected)
        assert isinstance(info.value.last_error, TransientOperationError)
        clock.now += expected + 0.001
        expected = min(expected * 2, MAX_BACKOFF)
    assert expected == MAX_BACKOFF == 122.0


def test_backoff_allows_retry_once_waited() -> None:
    """Once the wait is over the same operation runs, and success forgets the key."""
    clock = Clock()
    executor = OperationExecutor(workers=0, clock=clock)
    key = OperationKey(volume="v", pod="p")
    executor.run(key, OperationKind.SET_UP, fail)
    clock.now += 0.499
    with pytest.raises(OperationBackoffError):
        executor.run(key, OperationKind.SET_UP, ok)
    clock.now += 0.002
    executor.run(key, OperationKind.SET_UP, ok).result()
    assert executor.failures() == []
    executor.run(key, OperationKind.SET_UP, fail)
    with pytest.raises(OperationBackoffError) as info:
        executor.run(key, OperationKind.SET_UP, ok)
    assert info.value.retry_in == pytest.approx(0.5)  # started over after the success


def test_different_operation_runs_at_once_and_resets_backoff() -> None:
    """Another kind on a backing-off key is not refused, and it restarts the backoff."""
    clock = Clock()
    executor = OperationExecutor(workers=0, clock=clock)
    key = OperationKey(volume="v")
    for _ in range(4):  # back off to 4 s
        executor.run(key, OperationKind.MOUNT_DEVICE, fail)
        clock.now += 100
    executor.run(key, OperationKind.MOUNT_DEVICE, fail)
    executor.run(key, OperationKind.UNMOUNT_DEVICE, fail)  # not refused
    with pytest.raises(OperationBackoffError) as info:
        executor.run(key, OperationKind.UNMOUNT_DEVICE, fail)
    assert info.value.retry_in == pytest.approx(0.5)


def test_failures_report_the_error_and_wait() -> None:
    """failures() lists keys whose last run failed, with the error."""
    clock = Clock()
    executor = OperationExecutor(workers=0, clock=clock)
    future = executor.run(OperationKey(volume="v"), OperationKind.DETACH, fail)
    assert isinstance(future.exception(), TransientOperationError)
    [failure] = executor.failures()
    assert failure.kind is OperationKind.DETACH
    assert str(failure.error) == "boom"
    assert failure.retry_in == pytest.approx(0.5)


def test_wait_idle_and_pending() -> None:
    """pending() shows running operations; wait_idle returns once they end."""
    executor = OperationExecutor(workers=2)
    started, release, op = blocker()
    key = OperationKey(volume="v", pod="p")
    executor.run(key, OperationKind.TEAR_DOWN, op)
    assert started.wait(5)
    assert executor.pending() == [(key, OperationKind.TEAR_DOWN)]
    assert executor.is_pending(OperationKey(volume="v"))
    assert not executor.wait_idle(0.05)
    release.set()
    assert executor.wait_idle(5)
    assert executor.pending() == []
    executor.shutdown()


def test_wait_progress_returns_once_half_of_the_running_operations_ended() -> None:
    """A wait begun with four operations running outlasts the first to end and returns
    when the second does, with two still running; with none running it returns at once."""
    executor = OperationExecutor(workers=4)
    ops = running_blockers(executor, 4)
    assert not executor.wait_progress(0.05)
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(executor.wait_progress(5)))
    waiter.start()
    ops[0][1].set()
    waiter.join(0.3)
    assert waiter.is_alive()  # three still run
    ops[1][1].set()
    waiter.join(5)
    assert outcome == [True]
    assert len(executor.pending()) == 2
    for _, release, _ in ops[2:]:
        release.set()
    assert executor.wait_idle(5)
    assert executor.wait_progress(0)
    executor.shutdown()


def test_a_waiter_is_woken_when_its_wait_may_be_over_not_at_every_end() -> None:
    """A pass waiting for 8 of 16 operations to end is woken when the 8th ends, not at
    each of the 7 before (every wake-up makes its thread take the GIL again)."""
    executor = OperationExecutor(workers=16)
    ops = running_blockers(executor, 16)
    wakes = 0
    real_wait = executor._cond.wait

    def counting_wait(timeout: float | None = None) -> bool:
        nonlocal wakes
        woken = real_wait(timeout)
        wakes += 1
        return woken

    executor._cond.wait = counting_wait  # type: ignore[method-assign]
    waiter = threading.Thread(target=executor.wait_progress, args=(10,))
    waiter.start()
    for _, release, _ in ops[:7]:
        release.set()
    wait_until(lambda: len(executor.pending()) == 9, timeout=5, what="seven operations end")
    time.sleep(0.1)  # a wake-up on one of them would have come by now
    assert waiter.is_alive()
    ops[7][1].set()
    waiter.join(5)
    assert not waiter.is_alive()
    assert wakes == 1
    for _, release, _ in ops[8:]:
        release.set()
    assert executor.wait_idle(5)
    executor.shutdown()


def test_operations_on_different_volumes_run_in_parallel() -> None:
    """Two volumes' operations overlap in time on the worker threads."""
    executor = OperationExecutor(workers=2)
    barrier = threading.Barrier(2, timeout=5)
    t0 = time.monotonic()

    def meet() -> None:
        barrier.wait()

    futures = [
        executor.run(OperationKey(volume=name), OperationKind.SET_UP, meet) for name in ("a", "b")
    ]
    for f in futures:
        f.result(5)
    assert time.monotonic() - t0 < 5
    executor.shutdown()


def test_operations_do_their_local_work_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Operations on different keys run on several workers, but their local work one at a
    time (kubevol.util.turns): each blocks for a while without giving its turn up, and no other
    runs meanwhile; one that gives its turn up lets the others run."""
    monkeypatch.setattr(turns, "PATIENCE", 30.0)
    executor = OperationExecutor(workers=4)
    inside, waiting, release = Overlap(), threading.Event(), threading.Event()

    def local() -> None:
        with inside:
            time.sleep(0.02)

    def waits_on_a_driver() -> None:
        with turns.given_up():
            waiting.set()
            assert release.wait(10)

    try:
        executor.run(OperationKey(volume="w"), OperationKind.TEAR_DOWN, waits_on_a_driver)
        assert waiting.wait(5)
        for i in range(4):
            executor.run(OperationKey(volume=f"v{i}"), OperationKind.TEAR_DOWN, local)
        wait_until(lambda: inside.entries == 4, timeout=10)
        release.set()
        executor.wait_idle(10)
    finally:
        release.set()
        executor.shutdown(wait=True)
    assert inside.peak == 1
    assert not executor.failures()
