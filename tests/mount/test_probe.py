"""kubevol.mount.probe: calls below a mount point with a deadline, one stuck thread per mount
at most, and which filesystem types are suspect."""

from __future__ import annotations

import threading
import time

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
