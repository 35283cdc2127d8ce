"""Serving a :class:`StoragePlugin` on a unix socket or TCP port, gocsi style.

:func:`serve` runs until SIGTERM, SIGINT, SIGHUP or SIGQUIT, then drains in-flight calls and
removes the socket. :func:`serve_in_background` returns a :class:`ServerHandle` instead, for
tests, demos and agents that embed a driver.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from types import FrameType, TracebackType
from typing import Any

import attrs
import grpc

from kubevol.csi._rpc import RPCS
from kubevol.csi.endpoint import Endpoint, Scheme, parse_endpoint
from kubevol.csi.errors import CSIEndpointError, CSIServeError, status_for_exception
from kubevol.csi.locks import LockConfigError, VolumeLockProvider, lock_provider_from_env
from kubevol.csi.server.config import Mode, ServerConfig, ServerConfigError
from kubevol.csi.server.middleware import build_chain
from kubevol.csi.server.services import (
    ControllerService,
    CSIService,
    GroupControllerService,
    IdentityService,
    NodeService,
    SnapshotMetadataService,
    method_name,
)

_log = logging.getLogger("kubevol.csi.server")

#: Seconds in-flight calls get to finish when the server stops.
DEFAULT_GRACE = 30.0


@attrs.frozen(kw_only=True)
class StoragePlugin:
    """A CSI driver: its services and how to serve them (gocsi's ``StoragePlugin``).

    ``env_defaults`` are used for variables the environment does not set. ``before_serve``
    runs after the configuration is read and before the socket is created; raising there
    stops serving. ``interceptors`` are extra gRPC server interceptors (or kubevol
    :class:`~kubevol.csi.server.middleware.Middleware`) placed outside kubevol's own.
    """

    identity: IdentityService
    controller: ControllerService | None = None
    node: NodeService | None = None
    group_controller: GroupControllerService | None = None
    snapshot_metadata: SnapshotMetadataService | None = None
    interceptors: tuple[Any, ...] = attrs.field(default=(), converter=tuple)
    before_serve: Callable[[StoragePlugin, ServerConfig], None] | None = None
    env_defaults: Mapping[str, str] = attrs.field(factory=dict)
    max_workers: int = 16

    def services_for(self, mode: Mode) -> list[CSIService]:
        """The services to register in ``mode`` (Identity always)."""
        services: list[CSIService] = [self.identity]
        if mode in (Mode.CONTROLLER, Mode.BOTH):
            services += [
                s
                for s in (self.controller, self.group_controller, self.snapshot_metadata)
                if s is not None
            ]
        if mode in (Mode.NODE, Mode.BOTH) and self.node is not None:
            services.append(self.node)
        return services


def _stream_behavior(method: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Iterator[Any]]:
    """Streaming calls bypass the unary middleware; translate their errors here."""

    def behavior(request: Any, context: Any) -> Iterator[Any]:
        try:
            yield from method(request, context)
        except Exception as exc:
            code, message = status_for_exception(exc)
            context.abort(code, message)

    return behavior


def _generic_handler(service: CSIService) -> Any:
    handlers: dict[str, Any] = {}
    for rpc in RPCS.values():
        if rpc.service != service.SERVICE:
            continue
        method = getattr(service, method_name(rpc.name))
        if rpc.server_streaming:
            handlers[rpc.name] = grpc.unary_stream_rpc_method_handler(
                _stream_behavior(method),
                request_deserializer=rpc.request_type.FromString,
                response_serializer=rpc.response_type.SerializeToString,
            )
        else:
            handlers[rpc.name] = grpc.unary_unary_rpc_method_handler(
                method,
                request_deserializer=rpc.request_type.FromString,
                response_serializer=rpc.response_type.SerializeToString,
            )
    return grpc.method_handlers_generic_handler(f"csi.v1.{service.SERVICE}", handlers)


# --- unix socket handling -----------------------------------------------------------


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file nobody answers on; refuse a live socket or any other file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise CSIServeError(f"cannot serve on {path!r}: it exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        _log.info("removing stale socket %s left by an earlier process", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError as exc:
        raise CSIServeError(f"cannot tell whether socket {path!r} is in use: {exc}") from exc
    finally:
        probe.close()
    raise CSIServeError(f"cannot serve on {path!r}: another process is listening on it")


def _resolve_id(kind: str, value: str) -> int:
    if not value:
        return -1
    if value.isdigit():
        return int(value)
    try:
        if kind == "user":
            return pwd.getpwnam(value).pw_uid
        return grp.getgrnam(value).gr_gid
    except KeyError:
        name = "X_CSI_ENDPOINT_USER" if kind == "user" else "X_CSI_ENDPOINT_GROUP"
        raise CSIServeError(f"{name}={value!r}: no such {kind}") from None


def _secure_socket(path: str, perms: int, uid: int, gid: int) -> None:
    try:
        os.chmod(path, perms)
        if uid != -1 or gid != -1:
            os.chown(path, uid, gid)
    except OSError as exc:
        raise CSIServeError(f"cannot set owner or mode of socket {path!r}: {exc}") from exc


def _remove_own_socket(path: str) -> None:
    """Remove the socket this server created (never anything that is not a socket)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


# --- the server ---------------------------------------------------------------------


class ServerHandle:
    """A running driver server. :meth:`stop` drains calls and removes the socket."""

    def __init__(
        self,
        server: Any,
        endpoint: Endpoint,
        config: ServerConfig,
        lock_provider: VolumeLockProvider | None,
        owns_lock_provider: bool,
    ) -> None:
        self.server = server
        self.endpoint = endpoint
        self.config = config
        self._lock_provider = lock_provider
        self._owns_lock_provider = owns_lock_provider
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()

    @property
    def address(self) -> str:
        """The endpoint as a string a :class:`~kubevol.csi.CSIClient` accepts."""
        return str(self.endpoint)

    def stop(self, grace: float | None = DEFAULT_GRACE) -> None:
        """Refuse new calls, wait up to ``grace`` seconds for in-flight ones, clean up.

        Idempotent. The unix socket is removed (only if it is still a socket).
        """
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self.server.stop(grace).wait()
            if self.endpoint.scheme is Scheme.UNIX:
                _remove_own_socket(self.endpoint.address)
            if self._lock_provider is not None and self._owns_lock_provider:
                self._lock_provider.close()
            self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped; True if it was."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def effective_env(plugin: StoragePlugin, env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` (default: the process environment) over the plugin's ``env_defaults``."""
    merged = dict(plugin.env_defaults)
    merged.update(os.environ if env is None else env)
    return merged


def serve_in_background(
    plugin: StoragePlugin,
    endpoint: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    lock_provider: VolumeLockProvider | None = None,
) -> ServerHandle:
    """Start serving ``plugin`` on worker threads and return at once.

    ``endpoint`` overrides ``CSI_ENDPOINT``; ``env`` replaces the process environment;
    ``lock_provider`` replaces the one ``X_CSI_SERIAL_VOL_ACCESS*`` would build (the caller
    then owns it). Raises :class:`~kubevol.csi.server.config.ServerConfigError` for a bad
    variable, :class:`~kubevol.csi.errors.CSIEndpointError` for a bad or missing endpoint
    and :class:`~kubevol.csi.errors.CSIServeError` when the socket cannot be served.
    """
    variables = effective_env(plugin, env)
    config = ServerConfig.from_env(variables)
    address = endpoint if endpoint is not None else config.endpoint
    if not address:
        raise CSIEndpointError("no endpoint: set CSI_ENDPOINT (e.g. unix:///run/csi/csi.sock)")
    parsed = parse_endpoint(address)
    # Resolve the socket's owner before creating anything, so a typo leaves no socket.
    uid = _resolve_id("user", config.endpoint_user)
    gid = _resolve_id("group", config.endpoint_group)
    if plugin.before_serve is not None:
        plugin.before_serve(plugin, config)
    owns = lock_provider is None
    provider = lock_provider
    if config.serial_vol_access and provider is None:
        try:
            provider = lock_provider_from_env(variables)
        except LockConfigError as exc:
            raise ServerConfigError(str(exc)) from exc
    interceptors = build_chain(config, extra=plugin.interceptors, lock_provider=provider)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=plugin.max_workers, thread_name_prefix="csi"),
        interceptors=interceptors,
        options=[("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers([_generic_handler(s) for s in plugin.services_for(config.mode)])
    bound = False
    try:
        if parsed.scheme is Scheme.UNIX:
            _remove_stale_socket(parsed.address)
        try:
            port = server.add_insecure_port(parsed.grpc_target)
        except RuntimeError as exc:
            raise CSIServeError(f"cannot listen on {parsed}: {exc}") from exc
        if not port:
            raise CSIServeError(f"cannot listen on {parsed}")
        bound = True
        if parsed.scheme is Scheme.UNIX:
            _secure_socket(parsed.address, config.endpoint_perms, uid, gid)
        elif parsed.address.endswith(":0"):
            host = parsed.address.rpartition(":")[0]
            parsed = Endpoint(scheme=Scheme.TCP, address=f"{host}:{port}")
        server.start()
    except BaseException:
        server.stop(None)
        if bound and parsed.scheme is Scheme.UNIX:
            _remove_own_socket(parsed.address)
        if provider is not None and owns:
            provider.close()
        raise
    _log.info("serving CSI (%s) on %s", config.mode.value, parsed)
    return ServerHandle(server, parsed, config, provider, owns)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def serve(
    plugin: StoragePlugin,
    endpoint: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    grace: float = DEFAULT_GRACE,
) -> int:
    """Serve ``plugin`` until a stop signal, then drain and clean up; returns the exit code.

    Must run in the main thread (it installs signal handlers, restored on return). Raises
    like :func:`serve_in_background`.
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    try:
        handle = serve_in_background(plugin, endpoint, env=env)
        try:
            while not stop.wait(1.0):
                pass
        finally:
            handle.stop(grace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
