"""The HTTP side of the etcd lock provider (:mod:`kubevol.csidriver.locks.etcd`): clients of
etcd's JSON gateway through ``etcd3gw`` and ``requests``, fail-over between endpoints,
authentication, and the few requests a lock needs.

A module of its own so that only a process that builds an etcd provider loads the HTTP
client stack (a cost every command's start-up would pay otherwise).
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import requests

try:  # the optional "etcd" extra: only this provider needs it
    from etcd3gw import exceptions as etcd_exc
    from etcd3gw.client import Etcd3Client
except ImportError as _missing:
    _ETCD3GW_MISSING: ImportError | None = _missing
else:
    _ETCD3GW_MISSING = None

from kubevol.csidriver.locks.base import LockProviderError


class Endpoint(Protocol):
    """Where one etcd member answers (an :class:`~kubevol.csidriver.locks.etcd.EtcdEndpoint`)."""

    @property
    def protocol(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...

_log = logging.getLogger(__name__)

#: What to do when etcd3gw is not installed.
MISSING_EXTRA = (
    "the etcd lock provider needs the etcd3gw package, which kubevol's 'etcd' extra "
    "installs: pip install 'kubevol[etcd]'"
)

_T = TypeVar("_T")


def describe_error(exc: BaseException) -> str:
    """Text of an error; etcd3gw keeps the server's answer in ``detail_text``, not in args."""
    parts = [str(getattr(exc, "detail_text", None) or ""), str(exc)]
    return " ".join(p.strip() for p in parts if p.strip()) or type(exc).__name__


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class _TimeoutSession(requests.Session):
    """A session that applies separate connect and read timeouts to every request.

    etcd3gw passes one ``timeout`` for both phases; doing it here lets the dial timeout
    differ from the request timeout.
    """

    def __init__(self, *, dial_timeout: float, request_timeout: float) -> None:
        super().__init__()
        self._timeouts = (dial_timeout, request_timeout)

    def request(
        self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any
    ) -> requests.Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self._timeouts
        return super().request(method, url, *args, **kwargs)


class EtcdCluster:
    """Clients for each endpoint, with fail-over, authentication and error translation.

    This is the one place where etcd3gw and requests errors become :class:`LockProviderError`.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        dial_timeout: float,
        request_timeout: float,
        username: str | None,
        password: str | None,
        tls_insecure: bool,
    ) -> None:
        if _ETCD3GW_MISSING is not None:
            raise LockProviderError(MISSING_EXTRA) from _ETCD3GW_MISSING
        self._clients: list[Etcd3Client] = []
        for ep in endpoints:
            session = _TimeoutSession(dial_timeout=dial_timeout, request_timeout=request_timeout)
            if tls_insecure:
                session.verify = False
            self._clients.append(
                Etcd3Client(host=ep.host, port=ep.port, protocol=ep.protocol, session=session)
            )
        self._names = ", ".join(f"{ep.protocol}://{ep.host}:{ep.port}" for ep in endpoints)
        self._username = username
        self._password = password or ""
        self._guard = threading.Lock()
        self._current = 0
        self._authenticated: set[int] = set()

    def call(self, what: str, op: Callable[[Etcd3Client], _T]) -> _T:
        """Run ``op`` on the current endpoint, failing over to the others if it is unreachable.

        Raises :class:`LockProviderError` (naming ``what``) if no endpoint answers or etcd
        answers an error.
        """
        with self._guard:
            start = self._current
        last: BaseException | None = None
        for step in range(len(self._clients)):
            index = (start + step) % len(self._clients)
            client = self._clients[index]
            try:
                result = self._call_one(index, client, op)
            except (
                etcd_exc.ConnectionFailedError,
                etcd_exc.ConnectionTimeoutError,
                requests.ConnectionError,
                requests.Timeout,
            ) as exc:
                last = exc
                _log.debug(
                    "etcd endpoint %s failed during %s: %s",
                    client.base_url, what, describe_error(exc),
                )
                continue
            except (etcd_exc.Etcd3Exception, requests.RequestException, ValueError) as exc:
                # ValueError: a body that is not JSON.
                raise LockProviderError(
                    f"etcd {what} failed at {client.base_url}: {describe_error(exc)}"
                ) from exc
            with self._guard:
                self._current = index
            return result
        raise LockProviderError(
            f"etcd {what} failed: no endpoint answered ({self._names}): "
            f"{describe_error(last) if last else 'no endpoints'}"
        ) from last

    def _call_one(self, index: int, client: Etcd3Client, op: Callable[[Etcd3Client], _T]) -> _T:
        if self._username is None:
            return op(client)
        if index not in self._authenticated:
            self._authenticate(index, client)
        try:
            return op(client)
        except etcd_exc.Etcd3Exception as exc:
            # Simple tokens expire (--auth-token-ttl): get a new one and retry once.
            if "invalid auth token" not in describe_error(exc):
                raise
            self._authenticate(index, client)
            return op(client)

    def _authenticate(self, index: int, client: Etcd3Client) -> None:
        answer = client.post(
            client.get_url("/auth/authenticate"),
            json={"name": self._username, "password": self._password},
            # etcd refuses to authenticate a request that carries an expired token.
            headers={"Authorization": None},
        )
        token = answer.get("token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise etcd_exc.Etcd3Exception(f"authentication answered no token: {answer!r}")
        client.session.headers["Authorization"] = token
        with self._guard:
            self._authenticated.add(index)

    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        return self.call("lease grant", lambda c: _grant(c, ttl))

    def keepalive(self, lease_id: int) -> int:
        """Refresh a lease; its TTL left, <= 0 when etcd no longer has it."""
        return self.call("lease keep-alive", lambda c: _keepalive(c, lease_id))

    def revoke(self, lease_id: int) -> None:
        """Revoke a lease (deleting its keys); one already gone is fine."""
        self.call("lease revoke", lambda c: _revoke(c, lease_id))

    def create_with_lease(self, key: bytes, value: bytes, lease_id: int) -> bool:
        """See :func:`_create_with_lease`."""
        return self.call(
            "lock create", lambda c: _create_with_lease(c, key, value, lease_id)
        )

    def key_exists(self, key: bytes) -> bool:
        """Whether ``key`` exists (a read: no raft write)."""
        return self.call("lock poll", lambda c: _key_exists(c, key))

    def status(self) -> None:
        """Check that an endpoint answers (and accepts the credentials, if any)."""
        self.call("status check", lambda c: c.status())

    def close(self) -> None:
        for client in self._clients:
            client.session.close()


def _keepalive(client: Etcd3Client, lease_id: int) -> int:
    answer = client.post(client.get_url("/lease/keepalive"), json={"ID": lease_id})
    # etcd omits TTL (and answers TTL <= 0) for a lease that no longer exists.
    return int(answer.get("result", {}).get("TTL", -1))


def _grant(client: Etcd3Client, ttl: int) -> int:
    answer = client.post(client.get_url("/lease/grant"), json={"TTL": ttl, "ID": 0})
    return int(answer["ID"])


def _revoke(client: Etcd3Client, lease_id: int) -> None:
    try:
        client.post(client.get_url("/kv/lease/revoke"), json={"ID": lease_id})
    except etcd_exc.Etcd3Exception as exc:
        # Already expired or revoked: the goal is met.
        if "lease not found" not in describe_error(exc):
            raise


def _create_with_lease(client: Etcd3Client, key: bytes, value: bytes, lease_id: int) -> bool:
    """Create ``key`` attached to ``lease_id`` unless it exists; True if it is now ours.

    A key that already exists with our lease counts as ours: that happens when an earlier
    attempt was applied but its answer was lost and the request was retried.
    """
    k = _b64(key)
    answer = client.transaction(
        {
            "compare": [{"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": k, "value": _b64(value), "lease": lease_id}}],
            "failure": [{"request_range": {"key": k}}],
        }
    )
    if answer.get("succeeded"):
        return True
    responses = list(answer.get("responses", []))  # etcd3gw is untyped
    kvs = responses[0].get("response_range", {}).get("kvs", []) if responses else []
    return bool(kvs) and int(kvs[0].get("lease", 0)) == lease_id


def _key_exists(client: Etcd3Client, key: bytes) -> bool:
    answer = client.post(client.get_url("/kv/range"), json={"key": _b64(key), "count_only": True})
    return int(answer.get("count", 0)) > 0
