"""The driver framework's settings, read from gocsi's environment variables.

==================================  ============================================================
``CSI_ENDPOINT``                    ``unix:///path.sock``, ``tcp://host:port`` or a bare path
``X_CSI_MODE``                      ``controller``, ``node`` or empty/``both``
``X_CSI_ENDPOINT_PERMS``            socket mode, octal (default ``0755``)
``X_CSI_ENDPOINT_USER`` / _GROUP    socket owner, a name or a number
``X_CSI_DEBUG``                     turns request and response logging on
``X_CSI_REQ_LOGGING``               log requests (secrets redacted)
``X_CSI_REP_LOGGING``               log responses (secrets redacted)
``X_CSI_LOG_DISABLE_VOL_CTX``       leave volume contexts out of the log
``X_CSI_SPEC_VALIDATION``           validate requests and responses
``X_CSI_SPEC_REQ_VALIDATION``       validate requests
``X_CSI_SPEC_REP_VALIDATION``       validate responses
``X_CSI_SPEC_DISABLE_LEN_CHECK``    skip the spec's size limits
``X_CSI_MAX_PATH_LIMIT``            byte limit for path fields (default 4096)
``X_CSI_REQUIRE_STAGING_TARGET_PATH``  NodePublish needs staging_target_path
``X_CSI_REQUIRE_VOL_CONTEXT``       publish/stage/validate requests and CreateVolume replies
                                    need a volume context
``X_CSI_REQUIRE_PUB_CONTEXT``       NodeStage/NodePublish requests and ControllerPublish
                                    replies need a publish context
``X_CSI_REQUIRE_CREDS``             every secrets-taking call below needs secrets, or one by one:
                                    ``_CREATE_VOL``, ``_DELETE_VOL``, ``_CTRLR_PUB_VOL``,
                                    ``_CTRLR_UNPUB_VOL``, ``_NODE_STG_VOL``, ``_NODE_PUB_VOL``
``X_CSI_PLUGIN_INFO``               ``NAME, VERSION[, KEY=VALUE ...]`` answers GetPluginInfo
``X_CSI_SERIAL_VOL_ACCESS*``        serial volume access (see :mod:`kubevol.csi.locks.env`)
==================================  ============================================================

Booleans use Go's words (``true``, ``1``, ``false``, ...). A malformed value raises
:class:`ServerConfigError` naming the variable.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from kubevol.csi.locks import LockConfigError, lock_timeout_from_env, parse_bool
from kubevol.csi.locks.env import serial_volume_access_enabled
from kubevol.errors import KubevolError


class ServerConfigError(KubevolError, ValueError):
    """An environment variable of the driver framework is malformed; the message names it."""


class Mode(enum.StrEnum):
    """Which services a driver process serves (Identity always)."""

    CONTROLLER = "controller"
    NODE = "node"
    BOTH = "both"


#: Which RPC each ``X_CSI_REQUIRE_CREDS_*`` suffix guards.
CREDS_VARIABLES: Mapping[str, str] = {
    "CreateVolume": "X_CSI_REQUIRE_CREDS_CREATE_VOL",
    "DeleteVolume": "X_CSI_REQUIRE_CREDS_DELETE_VOL",
    "ControllerPublishVolume": "X_CSI_REQUIRE_CREDS_CTRLR_PUB_VOL",
    "ControllerUnpublishVolume": "X_CSI_REQUIRE_CREDS_CTRLR_UNPUB_VOL",
    "NodeStageVolume": "X_CSI_REQUIRE_CREDS_NODE_STG_VOL",
    "NodePublishVolume": "X_CSI_REQUIRE_CREDS_NODE_PUB_VOL",
}

DEFAULT_PATH_LIMIT = 4096


@attrs.frozen(kw_only=True)
class PluginInfoOverride:
    """The answer ``X_CSI_PLUGIN_INFO`` forces on GetPluginInfo."""

    name: str
    vendor_version: str
    manifest: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ServerConfig:
    """Everything the framework reads from the environment; see the module docstring."""

    endpoint: str = ""
    mode: Mode = Mode.BOTH
    endpoint_perms: int = 0o755
    endpoint_user: str = ""
    endpoint_group: str = ""
    req_logging: bool = False
    rep_logging: bool = False
    log_disable_vol_ctx: bool = False
    req_validation: bool = False
    rep_validation: bool = False
    disable_len_check: bool = False
    max_path_limit: int = DEFAULT_PATH_LIMIT
    require_staging_target_path: bool = False
    require_vol_context: bool = False
    require_pub_context: bool = False
    require_creds: frozenset[str] = frozenset()
    plugin_info: PluginInfoOverride | None = None
    serial_vol_access: bool = False
    serial_vol_access_timeout: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerConfig:
        """Read every variable from ``env``; raises :class:`ServerConfigError` on a bad one."""
        try:
            return cls._from_env(env)
        except LockConfigError as exc:
            raise ServerConfigError(str(exc)) from exc

    @classmethod
    def _from_env(cls, env: Mapping[str, str]) -> ServerConfig:
        def flag(name: str, default: bool = False) -> bool:
            value = env.get(name, "").strip()
            return default if not value else parse_bool(name, value)

        debug = flag("X_CSI_DEBUG")
        spec = flag("X_CSI_SPEC_VALIDATION")
        all_creds = flag("X_CSI_REQUIRE_CREDS")
        creds = frozenset(rpc for rpc, var in CREDS_VARIABLES.items() if all_creds or flag(var))
        return cls(
            endpoint=env.get("CSI_ENDPOINT", "").strip(),
            mode=_mode(env.get("X_CSI_MODE", "")),
            endpoint_perms=_perms(env.get("X_CSI_ENDPOINT_PERMS", "")),
            endpoint_user=env.get("X_CSI_ENDPOINT_USER", "").strip(),
            endpoint_group=env.get("X_CSI_ENDPOINT_GROUP", "").strip(),
            req_logging=debug or flag("X_CSI_REQ_LOGGING"),
            rep_logging=debug or flag("X_CSI_REP_LOGGING"),
            log_disable_vol_ctx=flag("X_CSI_LOG_DISABLE_VOL_CTX"),
            req_validation=spec or flag("X_CSI_SPEC_REQ_VALIDATION"),
            rep_validation=spec or flag("X_CSI_SPEC_REP_VALIDATION"),
            disable_len_check=flag("X_CSI_SPEC_DISABLE_LEN_CHECK"),
            max_path_limit=_positive_int(env, "X_CSI_MAX_PATH_LIMIT", DEFAULT_PATH_LIMIT),
            require_staging_target_path=flag("X_CSI_REQUIRE_STAGING_TARGET_PATH"),
            require_vol_context=flag("X_CSI_REQUIRE_VOL_CONTEXT"),
            require_pub_context=flag("X_CSI_REQUIRE_PUB_CONTEXT"),
            require_creds=creds,
            plugin_info=parse_plugin_info(env.get("X_CSI_PLUGIN_INFO", "")),
            serial_vol_access=serial_volume_access_enabled(env),
            serial_vol_access_timeout=lock_timeout_from_env(env),
        )


def _mode(text: str) -> Mode:
    value = text.strip().lower()
    if not value:
        return Mode.BOTH
    try:
        return Mode(value)
    except ValueError:
        raise ServerConfigError(f"X_CSI_MODE={text!r}: expected controller, node or both") from None


def _perms(text: str) -> int:
    value = text.strip()
    if not value:
        return 0o755
    try:
        perms = int(value, 8)
    except ValueError:
        raise ServerConfigError(
            f"X_CSI_ENDPOINT_PERMS={text!r} is not an octal mode like 0755"
        ) from None
    if not 0 <= perms <= 0o777:
        raise ServerConfigError(f"X_CSI_ENDPOINT_PERMS={text!r} is outside 0000..0777")
    return perms


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) == 0:
        raise ServerConfigError(f"{name}={value!r} is not a positive integer")
    return int(value)


def parse_plugin_info(text: str) -> PluginInfoOverride | None:
    """Parse ``NAME, VERSION[, KEY=VALUE ...]``; None for an empty value.

    Raises :class:`ServerConfigError` when the name or version is missing or a manifest
    item has no ``=``.
    """
    if not text.strip():
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ServerConfigError(
            f"X_CSI_PLUGIN_INFO={text!r}: expected 'NAME, VERSION[, KEY=VALUE ...]'"
        )
    manifest: dict[str, str] = {}
    for item in parts[2:]:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ServerConfigError(f"X_CSI_PLUGIN_INFO={text!r}: manifest item {item!r} lacks '='")
        manifest[key.strip()] = value.strip()
    return PluginInfoOverride(name=parts[0], vendor_version=parts[1], manifest=manifest)
