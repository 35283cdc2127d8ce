"""Covers kubevol.csidriver.locks.etcd.

EtcdLockProvider against a real etcd with authentication switched on.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import etcd3gw
import pytest

from kubevol.csidriver.locks import EtcdLockProvider, LockKind, LockProviderError
from kubevol.testing.etcd import EtcdServer

DOMAIN = "auth-test"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """An etcd whose tokens live 1 s, with user 'locker' allowed only /auth-test/…."""
    base: Path = tmp_path_factory.mktemp("etcd-auth")
    with EtcdServer(base, extra_args=["--auth-token=simple", "--auth-token-ttl=1"]) as server:
        client = etcd3gw.client(host="127.0.0.1", port=server.client_port)

        def post(path: str, body: dict[str, object]) -> None:
            client.post(client.get_url(path), json=body)

        post("/auth/role/add", {"name": "root"})
        post("/auth/user/add", {"name": "root", "password": "root-pw"})
        post("/auth/user/grant", {"user": "root", "role": "root"})
        post("/auth/role/add", {"name": "locker"})
        post(
            "/auth/role/grant",
            {
                "name": "locker",
                "perm": {
                    "permType": "READWRITE",
                    "key": _b64(f"/{DOMAIN}/"),
                    "range_end": _b64(f"/{DOMAIN}0"),  # "/" + 1 == "0": the whole prefix
                },
            },
        )
        post("/auth/user/add", {"name": "locker", "password": "s3cret"})
        post("/auth/user/grant", {"user": "locker", "role": "locker"})
        post("/auth/enable", {})
        client.session.close()
        yield server


def test_authenticated_provider_locks_and_survives_token_expiry(auth_etcd: EtcdServer) -> None:
    """With a username and password locks work, also after the 1 s auth token expired."""
    with EtcdLockProvider(
        endpoints=[auth_etcd.endpoint], domain=DOMAIN, ttl=2, username="locker", password="s3cret"
    ) as provider:
        first = provider.acquire(LockKind.BY_ID, "vol", 0)
        assert first is not None
        assert provider.acquire(LockKind.BY_ID, "vol", 0) is None
        first.release()
        time.sleep(2.5)  # the token expires: the provider must authenticate again
        second = provider.acquire(LockKind.BY_ID, "vol", 0)
        assert second is not None
        second.release()


def test_wrong_password_raises_provider_error(auth_etcd: EtcdServer) -> None:
    """A wrong password makes acquire raise LockProviderError that says authentication failed."""
    with (
        EtcdLockProvider(
            endpoints=[auth_etcd.endpoint], domain=DOMAIN, username="locker", password="wrong"
        ) as provider,
        pytest.raises(LockProviderError, match="authentication failed"),
    ):
        provider.acquire(LockKind.BY_ID, "vol", 0)


def test_no_credentials_are_refused(auth_etcd: EtcdServer) -> None:
    """Without credentials an auth-enabled etcd refuses, surfacing as LockProviderError."""
    with (
        EtcdLockProvider(endpoints=[auth_etcd.endpoint], domain=DOMAIN) as provider,
        pytest.raises(LockProviderError),
    ):
        provider.acquire(LockKind.BY_ID, "vol", 0)
