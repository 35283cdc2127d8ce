"""Covers kubevol.csidriver.locks.inprocess.

InProcessLockProvider: exclusion between the threads of one process.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from kubevol.csidriver.locks import InProcessLockProvider, LockConfigError, LockKind


def test_second_acquire_of_held_lock_returns_none() -> None:
    """A held lock cannot be taken again, by anyone, until released."""
    provider = InProcessLockProvider()
    first = provider.acquire(LockKind.BY_ID, "vol-1", 0)
    assert first is not None
    assert provider.acquire(LockKind.BY_ID, "vol-1", 0) is None
    first.release()
    again = provider.acquire(LockKind.BY_ID, "vol-1", 0)
    assert again is not None
    again.release()
    assert provider.held_count() == 0


def test_kinds_and_keys_are_independent() -> None:
    """BY_ID and BY_NAME locks with equal keys, and different keys, do not conflict."""
    provider = InProcessLockProvider()
    locks = [
        provider.acquire(LockKind.BY_ID, "x", 0),
        provider.acquire(LockKind.BY_NAME, "x", 0),
        provider.acquire(LockKind.BY_ID, "y", 0),
    ]
    assert all(lock is not None for lock in locks)
    assert provider.held_count() == 3


def test_release_is_idempotent_and_never_frees_a_later_holder() -> None:
    """Releasing twice does not release the lock someone else took in between."""
    provider = InProcessLockProvider()
    first = provider.acquire(LockKind.BY_ID, "vol", 0)
    assert first is not None
    first.release()
    second = provider.acquire(LockKind.BY_ID, "vol", 0)
    assert second is not None
    first.release()
    assert provider.acquire(LockKind.BY_ID, "vol", 0) is None


def test_timeout_waits_then_returns_none() -> None:
    """acquire waits about `timeout` seconds for a busy lock, then gives up with None."""
    provider = InProcessLockProvider()
    assert provider.acquire(LockKind.BY_NAME, "busy", 0) is not None
    started = time.monotonic()
    assert provider.acquire(LockKind.BY_NAME, "busy", 0.3) is None
    assert 0.3 <= time.monotonic() - started < 2


def test_waiter_gets_lock_released_during_its_wait() -> None:
    """A waiter is woken and takes the lock as soon as the holder releases it."""
    provider = InProcessLockProvider()
    held = provider.acquire(LockKind.BY_ID, "vol", 0)
    assert held is not None
    timer = threading.Timer(0.2, held.release)
    timer.start()
    started = time.monotonic()
    got = provider.acquire(LockKind.BY_ID, "vol", 10)
    elapsed = time.monotonic() - started
    timer.join()
    assert got is not None
    assert 0.15 <= elapsed < 2


def test_context_manager_releases() -> None:
    """A HeldLock used in `with` is released when the block ends."""
    provider = InProcessLockProvider()
    lock = provider.acquire(LockKind.BY_ID, "vol", 0)
    assert lock is not None
    with lock:
        assert provider.acquire(LockKind.BY_ID, "vol", 0) is None
    assert provider.held_count() == 0


@pytest.mark.parametrize("key", ["", "a\0b"])
def test_bad_key_is_rejected(key: str) -> None:
    """Empty keys and keys with NUL raise LockConfigError, a ValueError."""
    with pytest.raises(LockConfigError):
        InProcessLockProvider().acquire(LockKind.BY_ID, key, 0)
    with pytest.raises(ValueError, match="lock key"):
        InProcessLockProvider().acquire(LockKind.BY_NAME, key, 0)


def test_negative_timeout_is_rejected() -> None:
    """A negative timeout raises LockConfigError naming the value."""
    with pytest.raises(LockConfigError, match="-1"):
        InProcessLockProvider().acquire(LockKind.BY_ID, "vol", -1)


def test_many_threads_never_overlap_on_a_key() -> None:
    """32 threads hammering 4 keys: never two inside one key's section, and none starve."""
    provider = InProcessLockProvider()
    inside: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    violations: list[str] = []
    guard = threading.Lock()
    failures: list[str] = []

    def worker(n: int) -> None:
        for i in range(50):
            key = f"vol-{(n + i) % 4}"
            lock = provider.acquire(LockKind.BY_ID, key, 30)
            if lock is None:
                failures.append(key)
                continue
            with lock:
                with guard:
                    inside[key] += 1
                    entries[key] += 1
                    if inside[key] != 1:
                        violations.append(key)
                time.sleep(0)  # let other threads run while the lock is held
                with guard:
                    inside[key] -= 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert violations == []
    assert failures == []
    assert sum(entries.values()) == 32 * 50
    assert provider.held_count() == 0
