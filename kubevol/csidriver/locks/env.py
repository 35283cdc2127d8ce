"""Choosing and configuring a lock provider from gocsi's environment variables.

``X_CSI_SERIAL_VOL_ACCESS`` switches serial volume access on; ``X_CSI_SERIAL_VOL_ACCESS_TIMEOUT``
is how long a call waits for a busy volume (default 0: try once). When
``X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS`` is set the locks live in etcd, configured by:

=====================================  ===============================================
``…_ETCD_ENDPOINTS``                   comma-separated ``host:port`` or ``http(s)://host:port``
``…_ETCD_DOMAIN``                      key prefix (see :mod:`kubevol.csidriver.locks.etcd`)
``…_ETCD_TTL``                         lease TTL, a duration; unset or 0 means 60 s
``…_ETCD_DIAL_TIMEOUT``                connect timeout, a duration (default 5 s)
``…_ETCD_REQUEST_TIMEOUT``             per-request timeout, a duration (default 10 s; kubevol's own)
``…_ETCD_USERNAME`` / ``_PASSWORD``    etcd simple-token authentication
``…_ETCD_TLS`` / ``_TLS_INSECURE``     https for bare endpoints / skip certificate checks
=====================================  ===============================================

gocsi's gRPC-client knobs ``…_AUTO_SYNC_INTERVAL``, ``…_DIAL_KEEP_ALIVE_TIME``,
``…_DIAL_KEEP_ALIVE_TIMEOUT`` (durations), ``…_MAX_CALL_SEND_MSG_SZ``,
``…_MAX_CALL_RECV_MSG_SZ`` (integers), ``…_REJECT_OLD_CLUSTER`` and
``…_PERMIT_WITHOUT_STREAM`` (booleans) have no meaning for the HTTP gateway client: they
are checked for form, so a typo still fails loudly, and otherwise ignored.

Durations are Go's (``"10s"``, ``"500ms"``, ``"1m30s"``) or plain seconds (``"2.5"``);
booleans are Go's ``strconv.ParseBool`` words. An empty value counts as unset. A
malformed value raises :class:`~kubevol.csidriver.locks.base.LockConfigError` naming the variable.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from kubevol.csidriver.locks.base import LockConfigError, VolumeLockProvider
from kubevol.csidriver.locks.etcd import (
    DEFAULT_DIAL_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TTL,
    EtcdLockProvider,
)
from kubevol.csidriver.locks.inprocess import InProcessLockProvider
from kubevol.util.units import UnitError, duration_seconds

ENV_SERIAL_VOL_ACCESS = "X_CSI_SERIAL_VOL_ACCESS"
ENV_TIMEOUT = "X_CSI_SERIAL_VOL_ACCESS_TIMEOUT"
_ETCD = "X_CSI_SERIAL_VOL_ACCESS_ETCD_"
ENV_ETCD_ENDPOINTS = _ETCD + "ENDPOINTS"
ENV_ETCD_DOMAIN = _ETCD + "DOMAIN"
ENV_ETCD_TTL = _ETCD + "TTL"
ENV_ETCD_DIAL_TIMEOUT = _ETCD + "DIAL_TIMEOUT"
ENV_ETCD_REQUEST_TIMEOUT = _ETCD + "REQUEST_TIMEOUT"
ENV_ETCD_USERNAME = _ETCD + "USERNAME"
ENV_ETCD_PASSWORD = _ETCD + "PASSWORD"
ENV_ETCD_TLS = _ETCD + "TLS"
ENV_ETCD_TLS_INSECURE = _ETCD + "TLS_INSECURE"

# Checked for form only (see the module docstring).
_IGNORED_DURATIONS = tuple(
    _ETCD + n for n in ("AUTO_SYNC_INTERVAL", "DIAL_KEEP_ALIVE_TIME", "DIAL_KEEP_ALIVE_TIMEOUT")
)
_IGNORED_SIZES = tuple(_ETCD + n for n in ("MAX_CALL_SEND_MSG_SZ", "MAX_CALL_RECV_MSG_SZ"))
_IGNORED_BOOLS = tuple(_ETCD + n for n in ("REJECT_OLD_CLUSTER", "PERMIT_WITHOUT_STREAM"))

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

def parse_duration(name: str, text: str) -> float:
    """Parse a Go duration (``"1m30s"``, ``"500ms"``) or plain seconds into seconds.

    ``name`` is the variable or setting the text came from, used in the error. Raises
    :class:`LockConfigError` if ``text`` is neither form.
    """
    try:
        return duration_seconds(text, allow_negative=True)
    except UnitError:
        raise LockConfigError(
            f"{name}={text!r} is not a duration (like '10s', '500ms', '1m30s') "
            "or a number of seconds"
        ) from None


def parse_bool(name: str, text: str) -> bool:
    """Parse a boolean as Go's ``strconv.ParseBool`` does.

    Raises :class:`LockConfigError` naming ``name`` if ``text`` is not one.
    """
    value = text.strip()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise LockConfigError(f"{name}={text!r} is not a boolean (use true or false)")


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(env, name)
    return default if value is None else parse_bool(name, value)


def _non_negative_duration(env: Mapping[str, str], name: str) -> float | None:
    value = _get(env, name)
    if value is None:
        return None
    seconds = parse_duration(name, value)
    if seconds < 0 or not math.isfinite(seconds):
        raise LockConfigError(f"{name}={value!r} must not be negative")
    return seconds


def _positive_duration(env: Mapping[str, str], name: str, default: float) -> float:
    seconds = _non_negative_duration(env, name)
    if seconds is None:
        return default
    if seconds == 0:
        raise LockConfigError(f"{name}={env[name]!r} must be greater than zero")
    return seconds


def lock_timeout_from_env(env: Mapping[str, str]) -> float:
    """Seconds to wait for a busy volume, from ``X_CSI_SERIAL_VOL_ACCESS_TIMEOUT`` (default 0).

    Raises :class:`LockConfigError` for a malformed or negative value.
    """
    seconds = _non_negative_duration(env, ENV_TIMEOUT)
    return 0.0 if seconds is None else seconds


def serial_volume_access_enabled(env: Mapping[str, str]) -> bool:
    """Whether ``X_CSI_SERIAL_VOL_ACCESS`` is true (default false)."""
    return _bool(env, ENV_SERIAL_VOL_ACCESS, False)


def etcd_provider_from_env(env: Mapping[str, str]) -> EtcdLockProvider:
    """Build an :class:`EtcdLockProvider` from the ``X_CSI_SERIAL_VOL_ACCESS_ETCD_*`` variables.

    Every variable is checked before anything is built. Raises :class:`LockConfigError`
    naming the first malformed variable, or if no endpoint is given.
    """
    endpoints_text = _get(env, ENV_ETCD_ENDPOINTS) or ""
    endpoints = [e.strip() for e in endpoints_text.split(",") if e.strip()]
    if not endpoints:
        raise LockConfigError(f"{ENV_ETCD_ENDPOINTS} names no etcd endpoint")
    ttl = _non_negative_duration(env, ENV_ETCD_TTL)
    kwargs = {
        # gocsi treats a zero TTL as "use the default".
        "ttl": ttl if ttl else DEFAULT_TTL,
        "dial_timeout": _positive_duration(env, ENV_ETCD_DIAL_TIMEOUT, DEFAULT_DIAL_TIMEOUT),
        "request_timeout": _positive_duration(
            env, ENV_ETCD_REQUEST_TIMEOUT, DEFAULT_REQUEST_TIMEOUT
        ),
    }
    tls = _bool(env, ENV_ETCD_TLS, False)
    # As in gocsi, TLS_INSECURE only matters when TLS is on; it is still checked for form.
    tls_insecure = _bool(env, ENV_ETCD_TLS_INSECURE, False) and tls
    for name in _IGNORED_DURATIONS:
        _non_negative_duration(env, name)
    for name in _IGNORED_BOOLS:
        _bool(env, name, False)
    for name in _IGNORED_SIZES:
        value = _get(env, name)
        if value is not None and not re.fullmatch(r"\s*\d+\s*", value):
            raise LockConfigError(f"{name}={value!r} is not a non-negative integer (bytes)")
    username = _get(env, ENV_ETCD_USERNAME)
    password = _get(env, ENV_ETCD_PASSWORD)
    if password is not None and username is None:
        raise LockConfigError(f"{ENV_ETCD_PASSWORD} is set but {ENV_ETCD_USERNAME} is not")
    try:
        return EtcdLockProvider(
            endpoints=endpoints,
            domain=env.get(ENV_ETCD_DOMAIN, ""),
            username=username,
            password=password,
            tls=tls,
            tls_insecure=tls_insecure,
            **kwargs,
        )
    except LockConfigError as exc:
        raise LockConfigError(f"serial volume access etcd settings: {exc}") from exc


def lock_provider_from_env(env: Mapping[str, str]) -> VolumeLockProvider | None:
    """The provider ``env`` asks for: None unless ``X_CSI_SERIAL_VOL_ACCESS`` is true.

    etcd when ``X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS`` is set, in-process otherwise.
    Raises :class:`LockConfigError` naming any malformed variable; no network I/O.
    """
    if not serial_volume_access_enabled(env):
        return None
    lock_timeout_from_env(env)  # fail at start-up, not at the first call, on a bad timeout
    if _get(env, ENV_ETCD_ENDPOINTS) is None:
        return InProcessLockProvider()
    return etcd_provider_from_env(env)
