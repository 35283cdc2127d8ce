"""The driver framework's settings, read from gocsi's environment variables.

:data:`ENVIRONMENT` lists every variable with its default and meaning (``kubevol driver
serve --help`` prints it). As gocsi documents them:

- any ``X_CSI_REQUIRE_*`` switches request validation on by itself;
- the older names ``X_CSI_REQUIRE_VOL_ATTRIBS`` (= ``_VOL_CONTEXT``),
  ``X_CSI_REQUIRE_PUB_VOL_INFO`` (= ``_PUB_CONTEXT``) and ``X_CSI_REQUIRE_NODE_ID`` (the
  node id, required by the spec anyway) are read;
- ``CSI_MODE`` (the README's spelling) works when ``X_CSI_MODE`` is not set;
- ``X_CSI_LOG_LEVEL`` is PANIC, FATAL, ERROR, WARN, INFO or DEBUG (``X_CSI_DEBUG`` means
  DEBUG); unset, it is INFO, which is what gocsi applies (its usage text says WARN, its
  code sets INFO), or the level the embedding application chose. How
  :func:`~kubevol.csidriver.server.serve` applies it: :mod:`kubevol.csidriver.server.logs`;
- ``X_CSI_PLUGIN_INFO`` is CSV: a field in double quotes keeps its spaces and commas;
- a relative ``CSI_ENDPOINT`` (``csi.sock``) is a path in the working directory.

Booleans use Go's words (``true``, ``1``, ``false``, ...). A malformed value raises
:class:`ServerConfigError` naming the variable.
"""

from __future__ import annotations

import enum
import logging
import textwrap
from collections.abc import Mapping

import attrs

from kubevol.csidriver.locks import LockConfigError, lock_timeout_from_env, parse_bool
from kubevol.csidriver.locks.env import serial_volume_access_enabled
from kubevol.csidriver.locks.etcd import DEFAULT_DIAL_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_TTL
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

#: ``X_CSI_LOG_LEVEL`` words (logrus's) and the Python levels they mean.
LOG_LEVELS: Mapping[str, int] = {
    "PANIC": logging.CRITICAL,
    "FATAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
}

#: Older names gocsi still documents, and the variable each one stands for.
ALIASES: Mapping[str, str] = {
    "X_CSI_REQUIRE_VOL_ATTRIBS": "X_CSI_REQUIRE_VOL_CONTEXT",
    "X_CSI_REQUIRE_PUB_VOL_INFO": "X_CSI_REQUIRE_PUB_CONTEXT",
    "CSI_MODE": "X_CSI_MODE",
}


@attrs.frozen(kw_only=True)
class EnvVar:
    """One variable the framework reads: its name, default (as text) and meaning."""

    name: str
    default: str
    help: str


_ETCD = "X_CSI_SERIAL_VOL_ACCESS_ETCD_"

#: Every variable the framework reads, in the order ``--help`` shows them.
ENVIRONMENT: tuple[EnvVar, ...] = (
    EnvVar(name="CSI_ENDPOINT", default="(none)",
           help="unix:///path.sock, tcp://host:port, or a socket path (relative: in the "
                "working directory)"),
    EnvVar(name="X_CSI_MODE", default="(both)",
           help="controller, node, or empty for both; CSI_MODE is read too"),
    EnvVar(name="X_CSI_ENDPOINT_PERMS", default="0755", help="the unix socket's mode, octal"),
    EnvVar(name="X_CSI_ENDPOINT_USER", default="(this process's)",
           help="the unix socket's owner, a name or number"),
    EnvVar(name="X_CSI_ENDPOINT_GROUP", default="(this process's)",
           help="the unix socket's group, a name or number"),
    EnvVar(name="X_CSI_LOG_LEVEL", default="INFO",
           help="PANIC, FATAL, ERROR, WARN, INFO or DEBUG; unset, the level `kubevol -v` or "
                "the embedding application set stands (INFO when nothing set one)"),
    EnvVar(name="X_CSI_DEBUG", default="false",
           help="X_CSI_LOG_LEVEL=DEBUG plus request and response logging"),
    EnvVar(name="X_CSI_REQ_LOGGING", default="false", help="log requests (secrets redacted)"),
    EnvVar(name="X_CSI_REP_LOGGING", default="false", help="log responses (secrets redacted)"),
    EnvVar(name="X_CSI_LOG_DISABLE_VOL_CTX", default="false",
           help="leave volume contexts out of logged requests and responses"),
    EnvVar(name="X_CSI_SPEC_VALIDATION", default="false",
           help="validate requests and responses against the spec"),
    EnvVar(name="X_CSI_SPEC_REQ_VALIDATION", default="false", help="validate requests"),
    EnvVar(name="X_CSI_SPEC_REP_VALIDATION", default="false",
           help="validate responses (a bad one becomes INTERNAL)"),
    EnvVar(name="X_CSI_SPEC_DISABLE_LEN_CHECK", default="false",
           help="skip the spec's size limits"),
    EnvVar(name="X_CSI_MAX_PATH_LIMIT", default=str(DEFAULT_PATH_LIMIT),
           help="byte limit for path fields"),
    EnvVar(name="X_CSI_REQUIRE_STAGING_TARGET_PATH", default="false",
           help="NodePublish needs staging_target_path (implies request validation)"),
    EnvVar(name="X_CSI_REQUIRE_VOL_CONTEXT", default="false",
           help="publish/stage/validate requests need a volume context (older name: "
                "X_CSI_REQUIRE_VOL_ATTRIBS; implies request validation)"),
    EnvVar(name="X_CSI_REQUIRE_PUB_CONTEXT", default="false",
           help="NodeStage/NodePublish requests need a publish context (older name: "
                "X_CSI_REQUIRE_PUB_VOL_INFO; implies request validation)"),
    EnvVar(name="X_CSI_REQUIRE_NODE_ID", default="false",
           help="ControllerPublish needs node_id (the spec requires it anyway; implies "
                "request validation)"),
    EnvVar(name="X_CSI_REQUIRE_CREDS", default="false",
           help="every secrets-taking call below needs secrets (implies request validation)"),
    *(
        EnvVar(name=var, default="false", help=f"{rpc} needs secrets")
        for rpc, var in CREDS_VARIABLES.items()
    ),
    EnvVar(name="X_CSI_PLUGIN_INFO", default="(none)",
           help='"NAME, VERSION[, KEY=VALUE ...]" (CSV, quotes keep spaces) answers '
                "GetPluginInfo"),
    EnvVar(name="X_CSI_SERIAL_VOL_ACCESS", default="false",
           help="one call at a time per volume (ABORTED while another runs)"),
    EnvVar(name="X_CSI_SERIAL_VOL_ACCESS_TIMEOUT", default="0",
           help="how long a call waits for a busy volume, a duration"),
    EnvVar(name=_ETCD + "ENDPOINTS", default="(none)",
           help="etcd endpoints, comma-separated: locks live in etcd"),
    EnvVar(name=_ETCD + "DOMAIN", default="(none)", help="etcd key prefix"),
    EnvVar(name=_ETCD + "TTL", default=f"{DEFAULT_TTL:g}s", help="lease TTL, a duration"),
    EnvVar(name=_ETCD + "DIAL_TIMEOUT", default=f"{DEFAULT_DIAL_TIMEOUT:g}s",
           help="connect timeout, a duration"),
    EnvVar(name=_ETCD + "REQUEST_TIMEOUT", default=f"{DEFAULT_REQUEST_TIMEOUT:g}s",
           help="per-request timeout, a duration"),
    EnvVar(name=_ETCD + "USERNAME", default="(none)", help="etcd user"),
    EnvVar(name=_ETCD + "PASSWORD", default="(none)", help="etcd password"),
    EnvVar(name=_ETCD + "TLS", default="false", help="https for bare endpoints"),
    EnvVar(name=_ETCD + "TLS_INSECURE", default="false", help="skip certificate checks"),
    EnvVar(name=_ETCD + "AUTO_SYNC_INTERVAL, _DIAL_KEEP_ALIVE_TIME, _DIAL_KEEP_ALIVE_TIMEOUT, "
           "_MAX_CALL_SEND_MSG_SZ, _MAX_CALL_RECV_MSG_SZ, _REJECT_OLD_CLUSTER, "
           "_PERMIT_WITHOUT_STREAM", default="(none)",
           help="gocsi's etcd client knobs: checked for form, otherwise ignored"),
)  # fmt: skip


def describe_environment(width: int = 100) -> str:
    """:data:`ENVIRONMENT` as text: one ``NAME (default: X)`` line and an indented
    description per variable."""
    lines = []
    for var in ENVIRONMENT:
        lines.append(f"  {var.name}  (default: {var.default})")
        lines += textwrap.wrap(
            var.help, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6
        )
    return "\n".join(lines)


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
    require_node_id: bool = False
    plugin_info: PluginInfoOverride | None = None
    serial_vol_access: bool = False
    serial_vol_access_timeout: float = 0.0
    #: The level X_CSI_LOG_LEVEL or X_CSI_DEBUG asks for; None when neither is set.
    log_level: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerConfig:
        """Read every variable from ``env``; raises :class:`ServerConfigError` on a bad one."""
        try:
            return cls._from_env(env)
        except LockConfigError as exc:
            raise ServerConfigError(str(exc)) from exc

    @classmethod
    def _from_env(cls, env: Mapping[str, str]) -> ServerConfig:
        def value(name: str) -> str:
            """The variable's value, or its older name's when it is unset."""
            found = env.get(name, "").strip()
            if found:
                return found
            old = [k for k, v in ALIASES.items() if v == name]
            return next((env.get(o, "").strip() for o in old if env.get(o, "").strip()), "")

        def flag(name: str, default: bool = False) -> bool:
            text = value(name)
            return default if not text else parse_bool(name, text)

        debug = flag("X_CSI_DEBUG")
        spec = flag("X_CSI_SPEC_VALIDATION")
        all_creds = flag("X_CSI_REQUIRE_CREDS")
        creds = frozenset(rpc for rpc, var in CREDS_VARIABLES.items() if all_creds or flag(var))
        staging = flag("X_CSI_REQUIRE_STAGING_TARGET_PATH")
        vol_context = flag("X_CSI_REQUIRE_VOL_CONTEXT")
        pub_context = flag("X_CSI_REQUIRE_PUB_CONTEXT")
        node_id = flag("X_CSI_REQUIRE_NODE_ID")
        # gocsi: "Enabling this option sets X_CSI_SPEC_REQ_VALIDATION=true".
        any_require = staging or vol_context or pub_context or node_id or bool(creds)
        return cls(
            endpoint=env.get("CSI_ENDPOINT", "").strip(),
            mode=_mode(value("X_CSI_MODE")),
            endpoint_perms=_perms(env.get("X_CSI_ENDPOINT_PERMS", "")),
            endpoint_user=env.get("X_CSI_ENDPOINT_USER", "").strip(),
            endpoint_group=env.get("X_CSI_ENDPOINT_GROUP", "").strip(),
            req_logging=debug or flag("X_CSI_REQ_LOGGING"),
            rep_logging=debug or flag("X_CSI_REP_LOGGING"),
            log_disable_vol_ctx=flag("X_CSI_LOG_DISABLE_VOL_CTX"),
            req_validation=spec or any_require or flag("X_CSI_SPEC_REQ_VALIDATION"),
            rep_validation=spec or flag("X_CSI_SPEC_REP_VALIDATION"),
            disable_len_check=flag("X_CSI_SPEC_DISABLE_LEN_CHECK"),
            max_path_limit=_positive_int(env, "X_CSI_MAX_PATH_LIMIT", DEFAULT_PATH_LIMIT),
            require_staging_target_path=staging,
            require_vol_context=vol_context,
            require_pub_context=pub_context,
            require_creds=creds,
            require_node_id=node_id,
            plugin_info=parse_plugin_info(env.get("X_CSI_PLUGIN_INFO", "")),
            serial_vol_access=serial_volume_access_enabled(env),
            serial_vol_access_timeout=lock_timeout_from_env(env),
            log_level=logging.DEBUG if debug else _log_level(env.get("X_CSI_LOG_LEVEL", "")),
        )


def _log_level(text: str) -> int | None:
    value = text.strip().upper()
    if not value:
        return None
    if value not in LOG_LEVELS:
        raise ServerConfigError(
            f"X_CSI_LOG_LEVEL={text!r}: expected PANIC, FATAL, ERROR, WARN, INFO or DEBUG"
        )
    return LOG_LEVELS[value]


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


def _csv_fields(text: str) -> list[tuple[str, bool]]:
    """Split CSV as Go's ``encoding/csv`` does for one record: commas separate fields, a
    field in double quotes keeps its spaces and commas (``""`` is a quote). Returns each
    field and whether it was quoted; raises ValueError for a stray quote."""
    fields: list[tuple[str, bool]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == '"':
            i += 1
            out = []
            while True:
                if i >= n:
                    raise ValueError("a quoted field is not closed")
                if text[i] == '"':
                    if i + 1 < n and text[i + 1] == '"':
                        out.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                out.append(text[i])
                i += 1
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] != ",":
                raise ValueError(f"text after a quoted field: {text[i:]!r}")
            fields.append(("".join(out), True))
        else:
            end = text.find(",", i)
            end = n if end < 0 else end
            field = text[i:end].strip()
            if '"' in field:
                raise ValueError(f"a quote inside an unquoted field: {field!r}")
            fields.append((field, False))
            i = end
        if i >= n:
            return fields
        i += 1  # the comma


def parse_plugin_info(text: str) -> PluginInfoOverride | None:
    """Parse ``NAME, VERSION[, KEY=VALUE ...]`` (CSV: a quoted field keeps its spaces and
    commas); None for an empty value.

    Raises :class:`ServerConfigError` when the name or version is missing, the quoting is
    broken or a manifest item has no ``=``.
    """
    if not text.strip():
        return None
    usage = f"X_CSI_PLUGIN_INFO={text!r}: expected 'NAME, VERSION[, KEY=VALUE ...]'"
    try:
        fields = _csv_fields(text)
    except ValueError as exc:
        raise ServerConfigError(f"{usage}: {exc}") from None
    if len(fields) < 2 or not fields[0][0] or not fields[1][0]:
        raise ServerConfigError(usage)
    manifest: dict[str, str] = {}
    for item, quoted in fields[2:]:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ServerConfigError(f"X_CSI_PLUGIN_INFO={text!r}: manifest item {item!r} lacks '='")
        manifest[key if quoted else key.strip()] = value if quoted else value.strip()
    return PluginInfoOverride(
        name=fields[0][0], vendor_version=fields[1][0], manifest=manifest
    )
