"""Locks that serialise every process talking to one etcd cluster (gocsi's etcd provider).

A lock is one etcd key, ``<domain>/volumesByID/<id>`` or ``<domain>/volumesByName/<name>``,
where ``<domain>`` is ``/`` followed by the configured domain with its slashes trimmed, or
nothing when the domain is empty (so the keys are then ``/volumesByID/<id>``, as gocsi's
``path.Join("/", domain, …)`` makes them). The id or name is appended verbatim, never
path-cleaned, so two distinct ids can never share a key.

Taking a lock creates the key, attached to a fresh lease, in a transaction that succeeds
only if the key does not exist. While the lock is held a background thread keeps the lease
alive; a holder that dies stops refreshing and etcd deletes the key when the lease's TTL
runs out, letting another process in. Releasing revokes the lease, which deletes the key
in the same step (one request instead of a delete and a revoke); a key that meanwhile
belongs to another lease is never touched. A waiter polls the key with reads, which etcd
serves without a raft write, and tries the create transaction again once it is gone.

The client is ``etcd3gw``, which speaks to etcd's HTTP/JSON gateway (``/v3/…`` from etcd
3.4, found by asking ``/version``). Several endpoints give fail-over: a request that cannot
reach one endpoint is retried on the next (:mod:`kubevol.csidriver.locks.etcd_cluster`).
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from kubevol.csidriver.locks.base import (
    HeldLock,
    LockConfigError,
    LockKind,
    LockProviderError,
    VolumeLockProvider,
    check_lock_key,
    check_timeout,
)
from kubevol.util.backoff import Backoff

if TYPE_CHECKING:
    from kubevol.csidriver.locks.etcd_cluster import EtcdCluster

_log = logging.getLogger(__name__)

DEFAULT_PORT = 2379
DEFAULT_TTL = 60.0
DEFAULT_DIAL_TIMEOUT = 5.0
DEFAULT_REQUEST_TIMEOUT = 10.0

# Waiting for a busy lock polls with exponential backoff between these bounds; the upper
# bound keeps the wake-up latency after a release small without hammering etcd.
_WAIT_BACKOFF = Backoff(initial=0.01, maximum=0.2)


@attrs.frozen(kw_only=True)
class EtcdEndpoint:
    """One etcd client URL, parsed: ``protocol://host:port``."""

    protocol: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, tls: bool = False) -> EtcdEndpoint:
        """Parse ``host[:port]`` or ``http(s)://host[:port]``; bare ones use https if ``tls``.

        Raises :class:`LockConfigError` naming the endpoint if it cannot be parsed.
        """
        raw = text.strip()
        if not raw:
            raise LockConfigError("etcd endpoint must not be empty")
        url = raw if "://" in raw else ("https://" if tls else "http://") + raw
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise LockConfigError(
                f"etcd endpoint {text!r} is not host:port or a URL: {exc}"
            ) from exc
        if parts.scheme not in ("http", "https"):
            raise LockConfigError(
                f"etcd endpoint {text!r} has scheme {parts.scheme!r}; use http or https"
            )
        if not parts.hostname:
            raise LockConfigError(f"etcd endpoint {text!r} names no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise LockConfigError(f"etcd endpoint {text!r} must be only scheme://host:port")
        return cls(protocol=parts.scheme, host=parts.hostname, port=port or DEFAULT_PORT)


def normalise_domain(domain: str) -> str:
    """Return the key prefix for ``domain``: ``""`` for none, else ``"/a/b"`` (no trailing slash).

    Raises :class:`LockConfigError` for ``.``/``..`` segments or NUL, which gocsi would
    silently clean away into another domain.
    """
    segments = [s for s in domain.split("/") if s]
    for segment in segments:
        if segment in (".", "..") or "\0" in segment:
            raise LockConfigError(f"etcd lock domain {domain!r} has an invalid segment {segment!r}")
    return "".join("/" + s for s in segments)


class _KeepAlive:
    """One thread that refreshes every registered lease each ``interval`` seconds.

    A lease that etcd reports gone is dropped and its ``on_lost`` callback is called.
    Transient refresh failures are logged and retried at the next tick: the lease survives
    them as long as one refresh gets through within its TTL.
    """

    def __init__(self, cluster: EtcdCluster, interval: float) -> None:
        self._cluster = cluster
        self._interval = interval
        self._guard = threading.Lock()
        self._leases: dict[int, Callable[[], None]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, lease_id: int, on_lost: Callable[[], None]) -> None:
        with self._guard:
            if self._stop.is_set():
                raise LockProviderError("etcd lock provider is closed")
            self._leases[lease_id] = on_lost
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kubevol-etcd-lease-keepalive", daemon=True
                )
                self._thread.start()

    def set_on_lost(self, lease_id: int, on_lost: Callable[[], None]) -> None:
        with self._guard:
            if lease_id in self._leases:
                self._leases[lease_id] = on_lost

    def remove(self, lease_id: int) -> None:
        with self._guard:
            self._leases.pop(lease_id, None)

    def stop(self) -> None:
        self._stop.set()
        with self._guard:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._guard:
                leases = list(self._leases)
            for lease_id in leases:
                if self._stop.is_set():
                    return
                self._refresh(lease_id)

    def _refresh(self, lease_id: int) -> None:
        try:
            ttl = self._cluster.keepalive(lease_id)
        except LockProviderError as exc:
            _log.warning("could not refresh etcd lease %x, will retry: %s", lease_id, exc)
            return
        if ttl > 0:
            return
        with self._guard:
            on_lost = self._leases.pop(lease_id, None)
        if on_lost is not None:
            on_lost()


class EtcdHeldLock(HeldLock):
    """A held etcd lock: its key, and the lease kept alive until :meth:`release`."""

    def __init__(self, provider: EtcdLockProvider, key: bytes, lease_id: int) -> None:
        self._provider = provider
        self.key = key
        self.lease_id = lease_id
        self._lost = threading.Event()
        self._guard = threading.Lock()
        self._released = False

    @property
    def lost(self) -> bool:
        """True if the lease expired while held, so exclusion is no longer guaranteed."""
        return self._lost.is_set()

    def release(self) -> None:
        """Revoke the lease, which deletes the key. Idempotent; never raises.

        If etcd cannot be reached the key stays until the lease, no longer refreshed,
        expires (at most the provider's TTL later).
        """
        with self._guard:
            if self._released:
                return
            self._released = True
        self._provider._release(self)

    def _mark_lost(self) -> None:
        self._lost.set()
        _log.warning(
            "etcd lock %r lost: lease %x expired while held", self.key.decode(), self.lease_id
        )


class EtcdLockProvider(VolumeLockProvider):
    """Locks shared by every process using the same etcd cluster and domain.

    Construction does no network I/O; the first :meth:`acquire` does. ``ttl`` (seconds,
    rounded up to whole seconds; etcd may raise it to its minimum) bounds how long a dead
    holder's lock outlives it. ``dial_timeout`` and ``request_timeout`` bound connecting to
    and waiting for one endpoint. ``username``/``password`` use etcd's simple-token
    authentication; ``tls`` makes bare ``host:port`` endpoints use https, and
    ``tls_insecure`` skips certificate verification. Raises :class:`LockConfigError` for
    bad arguments.
    """

    def __init__(
        self,
        *,
        endpoints: Sequence[str],
        domain: str = "",
        ttl: float = DEFAULT_TTL,
        dial_timeout: float = DEFAULT_DIAL_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        username: str | None = None,
        password: str | None = None,
        tls: bool = False,
        tls_insecure: bool = False,
    ) -> None:
        if isinstance(endpoints, str):
            raise LockConfigError("etcd endpoints must be a sequence of strings, not one string")
        parsed = [EtcdEndpoint.parse(ep, tls=tls) for ep in endpoints]
        if not parsed:
            raise LockConfigError("etcd lock provider needs at least one endpoint")
        for name, value in (
            ("ttl", ttl),
            ("dial_timeout", dial_timeout),
            ("request_timeout", request_timeout),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise LockConfigError(
                    f"etcd lock provider {name} must be > 0 seconds, got {value!r}"
                )
        if password is not None and username is None:
            raise LockConfigError("etcd password given without a username")
        self.endpoints: tuple[EtcdEndpoint, ...] = tuple(parsed)
        self.prefix = normalise_domain(domain)
        self.ttl = max(1, math.ceil(ttl))
        # Loaded here, not at the top: every command imports this module (through the
        # driver framework's configuration) and most never build an etcd provider.
        from kubevol.csidriver.locks.etcd_cluster import EtcdCluster

        self._cluster = EtcdCluster(
            parsed,
            dial_timeout=dial_timeout,
            request_timeout=request_timeout,
            username=username,
            password=password,
            tls_insecure=tls_insecure,
        )
        # Refresh three times per TTL so that one or two failed refreshes are survivable.
        self._keepalive = _KeepAlive(self._cluster, self.ttl / 3)
        self._holder = f"{socket.gethostname()} pid {os.getpid()}".encode()
        self._guard = threading.Lock()
        self._held: set[EtcdHeldLock] = set()
        self._closed = False

    def ping(self) -> None:
        """Check that an endpoint answers (and accepts the credentials, if any).

        For a driver that wants to fail at start-up rather than at its first call. Raises
        :class:`LockProviderError` if no endpoint answers.
        """
        self._cluster.status()

    def key_for(self, kind: LockKind, key: str) -> str:
        """The etcd key that holds the lock for (kind, key)."""
        check_lock_key(kind, key)
        return f"{self.prefix}/{kind.value}/{key}"

    def acquire(self, kind: LockKind, key: str, timeout: float) -> HeldLock | None:
        """See :meth:`VolumeLockProvider.acquire`. Returns an :class:`EtcdHeldLock`.

        Raises :class:`LockProviderError` if etcd cannot be reached or the provider is closed.
        """
        etcd_key = self.key_for(kind, key).encode()
        deadline = time.monotonic() + check_timeout(timeout)
        if self._closed:
            raise LockProviderError("etcd lock provider is closed")
        lease_id = self._cluster.grant(self.ttl)
        try:
            # Keep the lease alive while waiting too, so a wait longer than the TTL works.
            self._keepalive.add(lease_id, lambda: None)
            lock = self._wait_for(etcd_key, lease_id, deadline)
        except BaseException:
            self._drop_lease(lease_id)
            raise
        if lock is None:
            self._drop_lease(lease_id)
        return lock

    def _wait_for(self, key: bytes, lease_id: int, deadline: float) -> EtcdHeldLock | None:
        polls = 0
        while True:
            if self._cluster.create_with_lease(key, self._holder, lease_id):
                lock = EtcdHeldLock(self, key, lease_id)
                self._keepalive.set_on_lost(lease_id, lock._mark_lost)
                with self._guard:
                    self._held.add(lock)
                return lock
            # Busy: poll with reads (no raft write, unlike a failing create transaction)
            # until the key is gone, then race for it again.
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                # Jitter so that waiters released together do not retry in lockstep.
                delay = _WAIT_BACKOFF.delay(polls)
                polls += 1
                time.sleep(min(delay * random.uniform(0.5, 1.0), remaining))
                if not self._cluster.key_exists(key):
                    break

    def _drop_lease(self, lease_id: int) -> None:
        self._keepalive.remove(lease_id)
        try:
            self._cluster.revoke(lease_id)
        except LockProviderError as exc:
            _log.warning("could not revoke etcd lease %x; it expires by itself: %s", lease_id, exc)

    def _release(self, lock: EtcdHeldLock) -> None:
        # Stop refreshing first: whatever happens next, the key is gone within one TTL.
        self._keepalive.remove(lock.lease_id)
        with self._guard:
            self._held.discard(lock)
        self._drop_lease(lock.lease_id)

    def close(self) -> None:
        """Release every lock still held, stop the keep-alive thread, close connections.

        Idempotent; never raises.
        """
        with self._guard:
            if self._closed:
                return
            self._closed = True
            held = list(self._held)
        for lock in held:
            lock.release()
        self._keepalive.stop()
        self._cluster.close()
