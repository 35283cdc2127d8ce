"""kubevol.mount.probe: calls below a mount point with a deadline, one stuck thread per mount
at most, and which filesystem types are suspect."""

from __future__ import annotations

import functools
import gc
import threading
import time
import weakref
from collections.abc import Callable

import pytest

from kubevol.mount.probe import PathProbe, UnresponsiveError, is_suspect


def test_a_call_that_does_not_answer_is_named_and_not_waited_for() -> None:
    """A blocked call raises UnresponsiveError (a TimeoutError) naming the path and the call
    within the timeout; the caller is free while the call stays stuck."""
    release = threading.Event()
    probe = PathProbe(timeout=0.2)
    started = time.monotonic()
    with pytest.raises(UnresponsiveError, match=r"/mnt/a/x: stat did not answer within 0.2s") \
            as caught:
        probe.call("/mnt/a", "/mnt/a/x", "stat", release.wait)
    assert time.monotonic() - started < 1.0
    assert isinstance(caught.value, TimeoutError) and caught.value.mount_point == "/mnt/a"
    assert probe.stuck() == {"/mnt/a": "stat"}
    release.set()


def test_a_stuck_mount_gets_no_second_thread() -> None:
    """While a call on a mount is stuck, the next one fails at once without a thread; once the
    stuck call ends, calls go through again. Other mounts are not affected."""
    release = threading.Event()
    probe = PathProbe(timeout=0.1)
    with pytest.raises(UnresponsiveError):
        probe.call("/mnt/a", "/mnt/a", "stat", release.wait)
    threads = threading.active_count()
    started = time.monotonic()
    with pytest.raises(UnresponsiveError, match="earlier stat below /mnt/a has not answered"):
        probe.call("/mnt/a", "/mnt/a/y", "statfs", lambda: 1)
    assert time.monotonic() - started < 0.05 and threading.active_count() == threads
    assert probe.call("/mnt/b", "/mnt/b", "stat", lambda: 2) == 2
    release.set()
    deadline = time.monotonic() + 5
    while probe.stuck() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.call("/mnt/a", "/mnt/a", "stat", lambda: 3) == 3


def test_stuck_threads_are_bounded() -> None:
    """No more than max_stuck threads are ever left stuck, all mounts together."""
    release = threading.Event()
    probe = PathProbe(timeout=0.05, max_stuck=2)
    for m in ("/a", "/b"):
        with pytest.raises(UnresponsiveError):
            probe.call(m, m, "stat", release.wait)
    with pytest.raises(UnresponsiveError, match="2 calls on unresponsive mounts"):
        probe.call("/c", "/c", "stat", lambda: 1)
    release.set()


def test_threads_whose_call_answered_make_the_next_calls() -> None:
    """A thread is not started per call: one whose call answered takes the next (a stats
    refresh of thousands of volumes once started thousands of threads)."""
    probe = PathProbe(timeout=5)
    threads = [probe.call("/m", "/m", "stat", threading.current_thread) for _ in range(50)]
    assert len({id(t) for t in threads}) <= 5, len({id(t) for t in threads})


def test_errors_of_the_call_are_raised_as_they_are() -> None:
    """An error of the call itself (ENOTCONN of a dead FUSE mount) is not a timeout."""
    def fail() -> None:
        raise ConnectionAbortedError(107, "Transport endpoint is not connected")

    with pytest.raises(ConnectionAbortedError):
        PathProbe(timeout=1).call("/m", "/m", "stat", fail)


@pytest.mark.parametrize(("fs_type", "suspect"), [
    ("nfs4", True), ("fuse.glusterfs", True), ("fuse.bindfs", True), ("lustre", True),
    ("ceph", True), ("ext4", False), ("tmpfs", False), ("xfs", False), ("overlay", False),
])
def test_network_and_fuse_types_are_suspect(fs_type: str, suspect: bool) -> None:
    """Network and FUSE filesystems are probed; local ones are not (no thread per stat)."""
    assert is_suspect(fs_type) is suspect


class _Pending:
    """A call answered by someone else (an RPC in flight): ends when ``end`` is called."""

    def __init__(self, value: object = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self._done = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def end(self) -> _Pending:
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()
        return self

    def done(self) -> bool:
        return self._done.is_set()

    def when_done(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def outcome(self) -> object:
        if self.error is not None:
            raise self.error
        return self.value


def test_calls_in_flight_cost_one_deadline_together_and_no_thread() -> None:
    """wait_each starts each call on the caller's thread and waits once: calls that do not
    answer cost one deadline together and are left stuck on their mounts (the next call
    there fails at once, until they end); the others' results and errors come back in
    order, and no thread is started for any of them."""
    # Two deadlines apart from one: a loaded machine's delays stay well inside the margin.
    probe = PathProbe(timeout=1.0)
    hung = [_Pending(), _Pending()]
    answering = _Pending("figures")
    threads = threading.active_count()

    def late() -> _Pending:
        threading.Timer(0.05, answering.end).start()
        return answering

    def refused() -> _Pending:
        raise OSError("not started")

    started = time.monotonic()
    results = probe.wait_each([
        ("/a", "/a", "stats", lambda: hung[0]),
        ("/b", "/b", "stats", late),
        ("/c", "/c", "stats", refused),
        ("/d", "/d", "stats", lambda: _Pending(error=ValueError("bad answer")).end()),
        ("/e", "/e", "stats", lambda: hung[1]),
    ])
    took = time.monotonic() - started
    assert 1.0 <= took < 1.8, took  # one deadline; one per hung call would be 2 s
    assert isinstance(results[0], UnresponsiveError) and results[0].mount_point == "/a"
    assert "stats did not answer within 1s" in str(results[0])
    assert results[1] == "figures"
    assert isinstance(results[2], OSError) and isinstance(results[3], ValueError)
    assert isinstance(results[4], UnresponsiveError)
    assert threading.active_count() <= threads + 1  # the Timer of the late call, if alive
    assert probe.stuck() == {"/a": "stats", "/e": "stats"}

    started = time.monotonic()
    (again,) = probe.wait_each([("/a", "/a", "stats", lambda: _Pending("x").end())])
    assert isinstance(again, UnresponsiveError) and "has not answered yet" in str(again)
    assert time.monotonic() - started < 0.05

    for pending in hung:
        pending.end()
    assert probe.stuck() == {}
    assert probe.wait_each([("/a", "/a", "stats", lambda: _Pending("x").end())]) == ["x"]


def _same(pending: _Pending) -> _Pending:
    return pending


def test_calls_in_flight_that_all_answer_are_not_waited_for_longer() -> None:
    """wait_each returns once the last call answered, not at the deadline."""
    probe = PathProbe(timeout=5)
    calls = [_Pending(i) for i in range(20)]
    for i, pending in enumerate(calls):
        threading.Timer(0.01 * i, pending.end).start()
    started = time.monotonic()
    results = probe.wait_each([(f"/m{i}", f"/m{i}", "stats", functools.partial(_same, p))
                               for i, p in enumerate(calls)])
    assert results == list(range(20))
    assert time.monotonic() - started < 1.0


def test_calls_in_flight_are_bounded_and_a_stuck_one_holds_up_no_other() -> None:
    """No more than ``window`` calls are in flight at once; one that does not answer is
    given up at its own deadline while the others go on through the other places."""
    probe = PathProbe(timeout=0.4)
    lock = threading.Lock()
    flying = [0, 0]  # now, most

    def quick(value: int) -> _Pending:
        pending = _Pending(value)
        with lock:
            flying[0] += 1
            flying[1] = max(flying[1], flying[0])

        def end() -> None:
            with lock:
                flying[0] -= 1
            pending.end()

        threading.Timer(0.02, end).start()
        return pending

    hung = _Pending()
    calls: list[tuple[str, str, str, Callable[[], _Pending]]] = [
        ("/hung", "/hung", "stats", lambda: hung)]
    calls += [(f"/m{i}", f"/m{i}", "stats", functools.partial(quick, i)) for i in range(8)]
    started = time.monotonic()
    results = probe.wait_each(calls, window=3)
    assert time.monotonic() - started < 0.7
    assert isinstance(results[0], UnresponsiveError)
    assert results[1:] == list(range(8))
    assert flying[1] <= 2  # the hung call holds the third place
    hung.end()


def test_a_call_left_stuck_is_held_until_it_ends() -> None:
    """A gRPC call whose last reference goes is cancelled: one left stuck by wait_each must
    go on (and keep its mount from being asked again) until it ends, so the probe holds it
    though the caller dropped it."""
    probe = PathProbe(timeout=0.05)
    cancelled: list[str] = []
    started: list[weakref.ref[_Pending]] = []

    class CancelledWhenDropped(_Pending):
        def __del__(self) -> None:
            if not self.done():
                cancelled.append("cancelled while in flight")

    def start() -> _Pending:
        pending = CancelledWhenDropped()
        started.append(weakref.ref(pending))
        return pending

    (result,) = probe.wait_each([("/a", "/a", "stats", start)])
    assert isinstance(result, UnresponsiveError)
    gc.collect()
    assert cancelled == []
    assert probe.stuck() == {"/a": "stats"}
    held = started[0]()
    assert held is not None
    held.end()
    assert probe.stuck() == {}
