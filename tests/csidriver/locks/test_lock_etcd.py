"""Covers kubevol.csidriver.locks.etcd.

EtcdLockProvider against a real etcd server started on loopback.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import etcd3gw
import pytest
from etcd3gw.client import Etcd3Client
from etcd3gw.lease import Lease

from kubevol.csidriver.locks import (
    EtcdHeldLock,
    EtcdLockProvider,
    LockConfigError,
    LockKind,
    LockProviderError,
)
from kubevol.testing.etcd import EtcdServer

# The fixtures' factory types (defined in conftest.py, which tests do not import).
ProviderFactory = Callable[..., EtcdLockProvider]
HolderFactory = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> Iterator[Etcd3Client]:
    """A plain etcd3gw client to inspect the server directly."""
    client = etcd3gw.client(host="127.0.0.1", port=etcd_server.client_port)
    yield client
    client.session.close()


def keys_under(client: Etcd3Client, prefix: str) -> dict[str, int]:
    """Keys under ``prefix`` mapped to the lease each is attached to."""
    return {
        meta["key"].decode(): int(meta.get("lease", 0))
        for _, meta in client.get_prefix(prefix.encode())
    }


def lease_ids(client: Etcd3Client) -> set[int]:
    """Ids of every lease etcd knows."""
    answer = client.post(client.get_url("/lease/leases"), json={})
    return {int(lease["ID"]) for lease in answer.get("leases", [])}


def acquired(lock: object) -> EtcdHeldLock:
    """Narrow an acquire() result to a held etcd lock, failing the test otherwise."""
    assert isinstance(lock, EtcdHeldLock)
    return lock


def test_keys_follow_gocsi_layout(
    make_provider: ProviderFactory, etcd: Etcd3Client, domain: str
) -> None:
    """Locks are /<domain>/volumesByID/<id> and /<domain>/volumesByName/<name>, on a lease."""
    provider = make_provider()
    by_id = acquired(provider.acquire(LockKind.BY_ID, "vol-1", 0))
    by_name = acquired(provider.acquire(LockKind.BY_NAME, "pvc-1", 0))
    assert keys_under(etcd, f"/{domain}/") == {
        f"/{domain}/volumesByID/vol-1": by_id.lease_id,
        f"/{domain}/volumesByName/pvc-1": by_name.lease_id,
    }
    assert by_id.lease_id != by_name.lease_id
    assert 0 < Lease(by_id.lease_id, etcd).ttl() <= 5


def test_empty_domain_and_slashes_are_normalised(
    make_provider: ProviderFactory, etcd: Etcd3Client, domain: str
) -> None:
    """An empty domain gives /volumesByID/<id>; a domain's outer slashes are trimmed."""
    bare = make_provider(domain="")
    nested = make_provider(domain=f"/{domain}/sub/")
    vol = f"{domain}-vol"
    acquired(bare.acquire(LockKind.BY_ID, vol, 0))
    acquired(nested.acquire(LockKind.BY_NAME, "n", 0))
    assert list(keys_under(etcd, f"/volumesByID/{vol}")) == [f"/volumesByID/{vol}"]
    assert list(keys_under(etcd, f"/{domain}/")) == [f"/{domain}/sub/volumesByName/n"]


def test_ids_are_used_verbatim(
    make_provider: ProviderFactory, etcd: Etcd3Client, domain: str
) -> None:
    """An id with slashes or dots is not path-cleaned, so it cannot alias another id's lock."""
    provider = make_provider()
    acquired(provider.acquire(LockKind.BY_ID, "b", 0))
    acquired(provider.acquire(LockKind.BY_ID, "a/../b", 0))
    assert sorted(keys_under(etcd, f"/{domain}/")) == [
        f"/{domain}/volumesByID/a/../b",
        f"/{domain}/volumesByID/b",
    ]


def test_bad_domain_is_rejected() -> None:
    """A domain with a '..' segment raises LockConfigError instead of being cleaned away."""
    with pytest.raises(LockConfigError, match=r"\.\."):
        EtcdLockProvider(endpoints=["127.0.0.1:2379"], domain="a/../b")


def test_release_deletes_key_and_revokes_lease(
    make_provider: ProviderFactory, etcd: Etcd3Client, domain: str
) -> None:
    """release removes the key and the lease; a second release is harmless."""
    lock = acquired(make_provider().acquire(LockKind.BY_ID, "vol", 0))
    lock.release()
    lock.release()
    assert keys_under(etcd, f"/{domain}/") == {}
    assert Lease(lock.lease_id, etcd).ttl() == -1


def test_two_providers_exclude_each_other(make_provider: ProviderFactory) -> None:
    """While one provider holds a lock another gets None, after waiting its timeout."""
    first, second = make_provider(), make_provider()
    held = acquired(first.acquire(LockKind.BY_ID, "vol", 0))
    assert second.acquire(LockKind.BY_ID, "vol", 0) is None
    started = time.monotonic()
    assert second.acquire(LockKind.BY_ID, "vol", 0.5) is None
    assert 0.5 <= time.monotonic() - started < 3
    assert second.acquire(LockKind.BY_NAME, "vol", 0) is not None  # other kind: no conflict
    held.release()
    assert second.acquire(LockKind.BY_ID, "vol", 0) is not None


def test_failed_attempt_leaves_nothing_behind(
    make_provider: ProviderFactory, etcd: Etcd3Client, domain: str
) -> None:
    """A timed-out acquire revokes the lease it granted and leaves the holder's key alone."""
    first, second = make_provider(), make_provider()
    held = acquired(first.acquire(LockKind.BY_ID, "vol", 0))
    leases_before = lease_ids(etcd)
    assert second.acquire(LockKind.BY_ID, "vol", 0.2) is None
    leases_after = lease_ids(etcd)
    assert leases_after - leases_before == set()  # the attempt's lease is gone
    assert held.lease_id in leases_after
    assert keys_under(etcd, f"/{domain}/") == {f"/{domain}/volumesByID/vol": held.lease_id}


def test_waiter_gets_lock_when_holder_releases(make_provider: ProviderFactory) -> None:
    """A waiting acquire succeeds soon after the other holder releases."""
    first, second = make_provider(), make_provider()
    held = acquired(first.acquire(LockKind.BY_ID, "vol", 0))
    timer = threading.Timer(0.5, held.release)
    timer.start()
    started = time.monotonic()
    got = second.acquire(LockKind.BY_ID, "vol", 10)
    elapsed = time.monotonic() - started
    timer.join()
    assert got is not None
    assert 0.4 <= elapsed < 2


def test_lock_outlives_its_ttl_while_held(make_provider: ProviderFactory) -> None:
    """The keep-alive thread keeps a 1 s lease alive across 3 s of holding."""
    holder, other = make_provider(ttl=1), make_provider(ttl=1)
    held = acquired(holder.acquire(LockKind.BY_ID, "vol", 0))
    time.sleep(3)
    assert other.acquire(LockKind.BY_ID, "vol", 0) is None
    assert not held.lost


def test_wait_longer_than_ttl_succeeds(make_provider: ProviderFactory) -> None:
    """A waiter whose wait exceeds its lease TTL still gets the lock (its lease is kept alive)."""
    holder, waiter = make_provider(ttl=1), make_provider(ttl=1)
    held = acquired(holder.acquire(LockKind.BY_ID, "vol", 0))
    timer = threading.Timer(2.5, held.release)
    timer.start()
    got = waiter.acquire(LockKind.BY_ID, "vol", 10)
    timer.join()
    lock = acquired(got)
    assert not lock.lost


def test_lost_lease_is_reported_and_release_spares_new_holder(
    make_provider: ProviderFactory, etcd: Etcd3Client, domain: str
) -> None:
    """A lease revoked behind our back marks the lock lost; its release spares the new key."""
    first, second = make_provider(ttl=1), make_provider()
    stale = acquired(first.acquire(LockKind.BY_ID, "vol", 0))
    Lease(stale.lease_id, etcd).revoke()
    fresh = acquired(second.acquire(LockKind.BY_ID, "vol", 0))
    deadline = time.monotonic() + 5
    while not stale.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stale.lost
    stale.release()
    assert keys_under(etcd, f"/{domain}/") == {f"/{domain}/volumesByID/vol": fresh.lease_id}


def test_close_releases_held_locks(
    make_provider: ProviderFactory, etcd: Etcd3Client, domain: str
) -> None:
    """close releases what is held, is idempotent, and later acquires raise LockProviderError."""
    provider = make_provider()
    acquired(provider.acquire(LockKind.BY_ID, "a", 0))
    acquired(provider.acquire(LockKind.BY_NAME, "b", 0))
    provider.close()
    provider.close()
    assert keys_under(etcd, f"/{domain}/") == {}
    with pytest.raises(LockProviderError, match="closed"):
        provider.acquire(LockKind.BY_ID, "a", 0)


def test_fails_over_to_a_live_endpoint(
    make_provider: ProviderFactory, etcd_server: EtcdServer, unused_port: int
) -> None:
    """With a dead endpoint listed first, locks are still taken through the live one."""
    provider = make_provider(endpoints=[f"127.0.0.1:{unused_port}", etcd_server.client_url])
    assert provider.acquire(LockKind.BY_ID, "vol", 0) is not None


def test_unreachable_etcd_raises_provider_error(
    make_provider: ProviderFactory, unused_port: int
) -> None:
    """With no endpoint answering, acquire raises LockProviderError naming the endpoint."""
    provider = make_provider(endpoints=[f"127.0.0.1:{unused_port}"], dial_timeout=0.5)
    with pytest.raises(LockProviderError, match=f"127.0.0.1:{unused_port}"):
        provider.acquire(LockKind.BY_ID, "vol", 0)


def test_ping_checks_reachability(make_provider: ProviderFactory, unused_port: int) -> None:
    """ping succeeds against the live etcd and raises LockProviderError against a dead port."""
    make_provider().ping()
    with pytest.raises(LockProviderError, match="status check"):
        make_provider(endpoints=[f"127.0.0.1:{unused_port}"]).ping()


def test_threads_sharing_one_provider_never_overlap(make_provider: ProviderFactory) -> None:
    """8 threads on one provider and one key: the critical sections never overlap."""
    provider = make_provider()
    inside = 0
    entries = 0
    overlaps = 0
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, entries, overlaps
        for _ in range(8):
            lock = provider.acquire(LockKind.BY_ID, "shared", 30)
            assert lock is not None
            with lock:
                with guard:
                    inside += 1
                    entries += 1
                    overlaps += inside != 1
                time.sleep(0.002)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert entries == 64
    assert overlaps == 0


def test_lock_held_by_another_process_excludes_us(
    make_provider: ProviderFactory, spawn_holder: HolderFactory
) -> None:
    """A lock held by another OS process is refused here until that process releases it."""
    holder = spawn_holder("hold", "vol", 5)
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "LOCKED"
    provider = make_provider()
    assert provider.acquire(LockKind.BY_ID, "vol", 0.3) is None
    holder.stdin.close()
    assert holder.stdout.readline().strip() == "RELEASED"
    assert provider.acquire(LockKind.BY_ID, "vol", 5) is not None
    assert holder.wait(10) == 0


def test_processes_take_turns(spawn_holder: HolderFactory, tmp_path: Path) -> None:
    """Three processes contending for one lock never interleave their critical sections."""
    log = tmp_path / "sections.log"
    rounds = 12
    procs = [spawn_holder("contend", "vol", 5, str(rounds), str(log)) for _ in range(3)]
    assert [proc.wait(120) for proc in procs] == [0, 0, 0]
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * rounds * len(procs)
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter.split()[0] == "enter"
        assert leave == "exit " + enter.split()[1]
    assert len({line.split()[1] for line in lines}) == 3


def test_killed_holders_lock_expires_with_its_lease(
    make_provider: ProviderFactory, spawn_holder: HolderFactory
) -> None:
    """A SIGKILLed holder's lock is still held at first, then free within about its TTL."""
    ttl = 2
    holder = spawn_holder("hold", "vol", ttl)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "LOCKED"
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    killed_at = time.monotonic()
    provider = make_provider()
    assert provider.acquire(LockKind.BY_ID, "vol", 0) is None
    assert provider.acquire(LockKind.BY_ID, "vol", 15) is not None
    assert time.monotonic() - killed_at < ttl + 2.5
