"""Covers kubevol.csidriver.locks.env.

Choosing and configuring lock providers from gocsi's environment variables.
"""

from __future__ import annotations

import pytest

from kubevol.csidriver.locks import (
    EtcdEndpoint,
    EtcdLockProvider,
    InProcessLockProvider,
    LockConfigError,
    LockKind,
    lock_provider_from_env,
    lock_timeout_from_env,
    parse_bool,
    parse_duration,
)
from kubevol.testing.etcd import EtcdServer

ON = {"X_CSI_SERIAL_VOL_ACCESS": "true"}
ETCD = {**ON, "X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS": "127.0.0.1:2379"}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("300us", 300e-6),
        ("2µs", 2e-6),
        ("7000ns", 7e-6),
        ("0", 0.0),
        ("2", 2.0),
        ("2.5", 2.5),
        (" 3s ", 3.0),
        ("-1s", -1.0),
    ],
)
def test_parse_duration_accepts_go_durations_and_seconds(text: str, seconds: float) -> None:
    """Go durations and plain numbers of seconds parse to seconds."""
    assert parse_duration("X", text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "10 seconds", "1x", "--1s", "1s2", "ten", "1e3s"])
def test_parse_duration_rejects_garbage(text: str) -> None:
    """Anything else raises LockConfigError naming the setting and the value."""
    with pytest.raises(LockConfigError, match=r"MY_VAR=") as info:
        parse_duration("MY_VAR", text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("1", True),
        ("T", True),
        ("TRUE", True),
        ("false", False),
        ("0", False),
        ("F", False),
        ("False", False),
    ],
)
def test_parse_bool_follows_go(text: str, value: bool) -> None:
    """The words Go's strconv.ParseBool accepts parse to the same value."""
    assert parse_bool("X", text) is value


@pytest.mark.parametrize("text", ["yes", "on", "2", "tRuE", ""])
def test_parse_bool_rejects_other_words(text: str) -> None:
    """Other words raise LockConfigError naming the setting."""
    with pytest.raises(LockConfigError, match="MY_FLAG"):
        parse_bool("MY_FLAG", text)


@pytest.mark.parametrize(
    "env", [{}, {"X_CSI_SERIAL_VOL_ACCESS": "false"}, {"X_CSI_SERIAL_VOL_ACCESS": ""}]
)
def test_no_provider_unless_switched_on(env: dict[str, str]) -> None:
    """Serial volume access is off unless X_CSI_SERIAL_VOL_ACCESS is true."""
    assert lock_provider_from_env({**env, "X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS": "h:1"}) is None


def test_in_process_provider_without_endpoints() -> None:
    """Switched on without etcd endpoints, the provider is the in-process one."""
    provider = lock_provider_from_env(ON)
    assert isinstance(provider, InProcessLockProvider)


def test_etcd_provider_settings_from_env() -> None:
    """Endpoints, domain, TTL, TLS and credentials are all taken from the environment."""
    provider = lock_provider_from_env(
        {
            **ON,
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS": "10.0.0.1:2379, https://etcd-b:4001,etcd-c",
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_DOMAIN": "csi.example.com",
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL": "2500ms",
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_TLS": "true",
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_USERNAME": "u",
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_PASSWORD": "p",
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_MAX_CALL_SEND_MSG_SZ": "2097152",
            "X_CSI_SERIAL_VOL_ACCESS_ETCD_AUTO_SYNC_INTERVAL": "1m",
        }
    )
    assert isinstance(provider, EtcdLockProvider)
    try:
        assert provider.endpoints == (
            EtcdEndpoint(protocol="https", host="10.0.0.1", port=2379),
            EtcdEndpoint(protocol="https", host="etcd-b", port=4001),
            EtcdEndpoint(protocol="https", host="etcd-c", port=2379),
        )
        assert provider.ttl == 3  # whole seconds, rounded up
        assert provider.key_for(LockKind.BY_ID, "v") == "/csi.example.com/volumesByID/v"
    finally:
        provider.close()


def test_zero_or_missing_ttl_means_sixty_seconds() -> None:
    """As in gocsi, an unset or zero TTL falls back to 60 s."""
    for env in (ETCD, {**ETCD, "X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL": "0s"}):
        provider = lock_provider_from_env(env)
        assert isinstance(provider, EtcdLockProvider)
        assert provider.ttl == 60
        provider.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X_CSI_SERIAL_VOL_ACCESS", "yes"),
        ("X_CSI_SERIAL_VOL_ACCESS_TIMEOUT", "ten"),
        ("X_CSI_SERIAL_VOL_ACCESS_TIMEOUT", "-1s"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS", "ftp://h:1"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS", "h:notaport"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS", " , "),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL", "1 minute"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL", "-5s"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_DIAL_TIMEOUT", "0"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_REQUEST_TIMEOUT", "fast"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_TLS", "maybe"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_TLS_INSECURE", "sure"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_AUTO_SYNC_INTERVAL", "often"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_DIAL_KEEP_ALIVE_TIME", "1q"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_DIAL_KEEP_ALIVE_TIMEOUT", "x"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_MAX_CALL_SEND_MSG_SZ", "2MiB"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_MAX_CALL_RECV_MSG_SZ", "-1"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_REJECT_OLD_CLUSTER", "nope"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_PERMIT_WITHOUT_STREAM", "2"),
        ("X_CSI_SERIAL_VOL_ACCESS_ETCD_PASSWORD", "secret-without-user"),
    ],
)
def test_malformed_variable_is_named_in_the_error(name: str, value: str) -> None:
    """Each malformed variable raises LockConfigError whose message names it."""
    with pytest.raises(LockConfigError) as info:
        lock_provider_from_env({**ETCD, name: value})
    message = str(info.value)
    if name == "X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS":
        assert "endpoint" in message
    else:
        assert name in message


def test_bad_domain_from_env_is_rejected() -> None:
    """A domain with '..' segments is refused at start-up."""
    with pytest.raises(LockConfigError, match="domain"):
        lock_provider_from_env({**ETCD, "X_CSI_SERIAL_VOL_ACCESS_ETCD_DOMAIN": "a/../b"})


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 0.0), ("", 0.0), ("3s", 3.0), ("250ms", 0.25), ("2", 2.0)]
)
def test_lock_timeout_from_env(value: str | None, seconds: float) -> None:
    """X_CSI_SERIAL_VOL_ACCESS_TIMEOUT defaults to 0 and takes durations or seconds."""
    env = {} if value is None else {"X_CSI_SERIAL_VOL_ACCESS_TIMEOUT": value}
    assert lock_timeout_from_env(env) == pytest.approx(seconds)


def test_env_built_provider_locks_in_real_etcd(etcd_server: EtcdServer, domain: str) -> None:
    """A provider built from gocsi-style variables takes exclusive locks in a real etcd."""
    env = {
        **ON,
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS": etcd_server.endpoint,
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_DOMAIN": domain,
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL": "5s",
    }
    first, second = lock_provider_from_env(env), lock_provider_from_env(env)
    assert isinstance(first, EtcdLockProvider) and isinstance(second, EtcdLockProvider)
    with first, second:
        held = first.acquire(LockKind.BY_NAME, "pvc-a", 0)
        assert held is not None
        assert second.acquire(LockKind.BY_NAME, "pvc-a", 0) is None
        held.release()
        assert second.acquire(LockKind.BY_NAME, "pvc-a", 0) is not None
