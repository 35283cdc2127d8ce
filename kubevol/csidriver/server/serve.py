"""Serving a :class:`StoragePlugin` on a unix socket or TCP port, gocsi style.

:func:`serve` runs until SIGTERM, SIGINT, SIGHUP or SIGQUIT, then drains in-flight calls and
removes the socket. :func:`serve_in_background` returns a :class:`ServerHandle` instead, for
tests, demos and agents that embed a driver. What a served driver logs, and where, is
:mod:`kubevol.csidriver.server.logs`.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from types import FrameType, TracebackType

import attrs
import grpc
from google.protobuf.message import Message

from kubevol.csi._rpc import RPCS
from kubevol.csi.endpoint import Endpoint, Scheme, parse_endpoint
from kubevol.csi.errors import CSIEndpointError, CSIServeError, status_for_exception
from kubevol.csi.unixsocket import UnixSocket, serve_on_unix_socket
from kubevol.csidriver.locks import LockConfigError, VolumeLockProvider, lock_provider_from_env
from kubevol.csidriver.server.config import Mode, ServerConfig, ServerConfigError
from kubevol.csidriver.server.executor import ElasticThreadPool
from kubevol.csidriver.server.logs import SERVER_LOGGER, driver_logging
from kubevol.csidriver.server.middleware import build_chain
from kubevol.csidriver.server.relay import ListenerRelay
from kubevol.csidriver.server.services import (
    ControllerService,
    CSIService,
    GroupControllerService,
    IdentityService,
    NodeService,
    SnapshotMetadataService,
    method_name,
)

_log = logging.getLogger(SERVER_LOGGER)

#: Seconds in-flight calls get to finish when the server stops.
DEFAULT_GRACE = 30.0

#: A gRPC server option: a ``grpc.*`` channel argument name and its value (an int or str).
ServerOption = tuple[str, int | str]


def _interceptors(items: Iterable[object]) -> tuple[object, ...]:
    return tuple(items)


def _server_options(items: Iterable[ServerOption]) -> tuple[ServerOption, ...]:
    return tuple(items)


@attrs.frozen(kw_only=True)
class StoragePlugin:
    """A CSI driver: its services and how to serve them (gocsi's ``StoragePlugin``).

    ``env_defaults`` are used for variables the environment does not set. ``before_serve``
    runs after the configuration is read and before the socket is created; raising there
    stops serving. ``interceptors`` are extra gRPC server interceptors (or kubevol
    :class:`~kubevol.csidriver.server.middleware.Middleware`) placed outside kubevol's own.
    ``name`` is the CSI plugin name the start line logs (``serving NAME (MODE) on
    ENDPOINT``); unset, ``X_CSI_PLUGIN_INFO``'s name, else ``CSI driver`` (GetPluginInfo is
    not called for it: a call would count as the driver's first).
    ``server_options`` are gRPC server options (``("grpc.max_receive_message_length", n)``,
    keepalive settings, ...), gocsi's ``ServerOpts``. Calls run on ``steady_workers``
    threads, and on more (up to ``max_workers``) only while calls are kept waiting (see
    :mod:`kubevol.csidriver.server.executor`).
    """

    identity: IdentityService
    name: str = ""
    controller: ControllerService | None = None
    node: NodeService | None = None
    group_controller: GroupControllerService | None = None
    snapshot_metadata: SnapshotMetadataService | None = None
    interceptors: tuple[object, ...] = attrs.field(default=(), converter=_interceptors)
    before_serve: Callable[[StoragePlugin, ServerConfig], None] | None = None
    env_defaults: Mapping[str, str] = attrs.field(factory=dict)
    max_workers: int = 16
    steady_workers: int = 4
    server_options: tuple[ServerOption, ...] = attrs.field(default=(), converter=_server_options)

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


def _stream_behavior(
    method: Callable[[Message, grpc.ServicerContext], Iterator[Message]],
) -> Callable[[Message, grpc.ServicerContext], Iterator[Message]]:
    """Streaming calls bypass the unary middleware; translate their errors here."""

    def behavior(request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        try:
            yield from method(request, context)
        except Exception as exc:
            code, message = status_for_exception(exc)
            context.abort(code, message)

    return behavior


def _generic_handler(service: CSIService) -> grpc.GenericRpcHandler:
    handlers: dict[str, grpc.RpcMethodHandler] = {}
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


# --- sockets ------------------------------------------------------------------------


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


def listener_endpoint(listener: socket.socket) -> Endpoint:
    """The endpoint a listening socket answers on (unix path or TCP host:port)."""
    name = listener.getsockname()
    if listener.family == socket.AF_UNIX:
        path = name.decode() if isinstance(name, bytes) else str(name)
        return Endpoint(scheme=Scheme.UNIX, address=path)
    host, port = name[0], name[1]
    return Endpoint(scheme=Scheme.TCP, address=f"{host}:{port}")


# --- the server ---------------------------------------------------------------------


class ServerHandle:
    """A running driver server. :meth:`stop` drains calls and removes the socket."""

    def __init__(
        self,
        server: grpc.Server,
        endpoint: Endpoint,
        config: ServerConfig,
        lock_provider: VolumeLockProvider | None,
        owns_lock_provider: bool,
        *,
        unix_socket: UnixSocket | None = None,
        relay: ListenerRelay | None = None,
        private_dir: str | None = None,
    ) -> None:
        self.server = server
        self.endpoint = endpoint
        self.config = config
        self._lock_provider = lock_provider
        self._owns_lock_provider = owns_lock_provider
        self._unix_socket = unix_socket
        self._relay = relay
        self._private_dir = private_dir
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        #: The calls' thread pool, ended once the server has stopped.
        self.pool: futures.Executor | None = None

    @property
    def address(self) -> str:
        """The endpoint as a string a :class:`~kubevol.csi.CSIClient` accepts."""
        return str(self.endpoint)

    def stop(self, grace: float | None = DEFAULT_GRACE) -> None:
        """Refuse new calls, wait up to ``grace`` seconds for in-flight ones, clean up.

        Idempotent. The unix socket is removed only while it is still this server's (a
        driver restarted on the same path keeps its socket). A listener handed to
        :func:`serve_in_background` is closed.
        """
        with self._stop_lock:
            if self._stopped.is_set():
                return
            if self._relay is not None:
                self._relay.stop()
            self.server.stop(grace).wait()
            if self.pool is not None:
                self.pool.shutdown(wait=False)
            if self._unix_socket is not None:
                self._unix_socket.remove()
            if self._private_dir is not None:
                shutil.rmtree(self._private_dir, ignore_errors=True)
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
    options: Sequence[ServerOption] = (),
    listener: socket.socket | None = None,
) -> ServerHandle:
    """Start serving ``plugin`` on worker threads and return at once.

    ``endpoint`` overrides ``CSI_ENDPOINT``; ``env`` replaces the process environment;
    ``lock_provider`` replaces the one ``X_CSI_SERIAL_VOL_ACCESS*`` would build (the caller
    then owns it). ``options`` are gRPC server options added to the plugin's
    ``server_options``. ``listener`` is an already-open, listening socket to serve on
    instead of an endpoint (it is closed when the server stops). Raises
    :class:`~kubevol.csidriver.server.config.ServerConfigError` for a bad variable,
    :class:`~kubevol.csi.errors.CSIEndpointError` for a bad or missing endpoint and
    :class:`~kubevol.csi.errors.CSIServeError` when the socket cannot be served.
    """
    variables = effective_env(plugin, env)
    config = ServerConfig.from_env(variables)
    parsed: Endpoint | None = None
    if listener is None:
        address = endpoint if endpoint is not None else config.endpoint
        if not address:
            raise CSIEndpointError(
                "no endpoint: set CSI_ENDPOINT (e.g. unix:///run/csi/csi.sock)"
            )
        parsed = parse_endpoint(address, relative_to=os.getcwd())
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
    pool = ElasticThreadPool(
        max(1, min(plugin.steady_workers, plugin.max_workers)),
        max(1, plugin.max_workers),
        thread_name_prefix="csi",
    )
    server = grpc.server(
        pool,
        interceptors=interceptors,
        options=[("grpc.so_reuseport", 0), *plugin.server_options, *options],
    )
    server.add_generic_rpc_handlers([_generic_handler(s) for s in plugin.services_for(config.mode)])
    try:
        if listener is not None:
            handle = _serve_on_listener(
                server, listener, config=config, provider=provider, owns=owns
            )
        else:
            assert parsed is not None
            handle = _serve_on_endpoint(
                server, parsed, config=config, provider=provider, owns=owns, uid=uid, gid=gid
            )
    except BaseException:
        if provider is not None and owns:
            provider.close()
        pool.shutdown(wait=False)
        raise
    handle.pool = pool
    _log.info("serving %s (%s) on %s", _label(plugin, config), _MODE_WORDS[config.mode],
              handle.endpoint)
    return handle


_MODE_WORDS = {Mode.BOTH: "controller and node", Mode.CONTROLLER: "controller", Mode.NODE: "node"}


def _label(plugin: StoragePlugin, config: ServerConfig) -> str:
    if plugin.name:
        return plugin.name
    if config.plugin_info is not None:
        return config.plugin_info.name
    return "CSI driver"


def _serve_on_endpoint(
    server: grpc.Server,
    parsed: Endpoint,
    *,
    config: ServerConfig,
    provider: VolumeLockProvider | None,
    owns: bool,
    uid: int,
    gid: int,
) -> ServerHandle:
    if parsed.scheme is Scheme.UNIX:
        unix = serve_on_unix_socket(
            server, parsed.address, mode=config.endpoint_perms, uid=uid, gid=gid
        )
        return ServerHandle(server, parsed, config, provider, owns, unix_socket=unix)
    try:
        port = server.add_insecure_port(parsed.grpc_target)
    except RuntimeError as exc:
        raise CSIServeError(f"cannot listen on {parsed}: {exc}") from exc
    if not port:
        raise CSIServeError(f"cannot listen on {parsed}")
    if parsed.address.endswith(":0"):
        host = parsed.address.rpartition(":")[0]
        parsed = Endpoint(scheme=Scheme.TCP, address=f"{host}:{port}")
    try:
        server.start()
    except BaseException:
        server.stop(None)
        raise
    return ServerHandle(server, parsed, config, provider, owns)


def _serve_on_listener(
    server: grpc.Server,
    listener: socket.socket,
    *,
    config: ServerConfig,
    provider: VolumeLockProvider | None,
    owns: bool,
) -> ServerHandle:
    private = tempfile.mkdtemp(prefix="kubevol-csi-relay-")
    try:
        backend = os.path.join(private, "csi.sock")
        unix = serve_on_unix_socket(server, backend, mode=0o600)
        relay = ListenerRelay(listener, backend)
        relay.start()
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return ServerHandle(
        server,
        listener_endpoint(listener),
        config,
        provider,
        owns,
        unix_socket=unix,
        relay=relay,
        private_dir=private,
    )


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def serve(
    plugin: StoragePlugin,
    endpoint: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    grace: float = DEFAULT_GRACE,
    options: Sequence[ServerOption] = (),
    listener: socket.socket | None = None,
) -> int:
    """Serve ``plugin`` until a stop signal, then drain and clean up; returns the exit code.

    ``options`` (gRPC server options) and ``listener`` (an already-open listening socket)
    are as for :func:`serve_in_background`. Must run in the main thread (it installs signal
    handlers, restored on return). Logging: stderr at ``X_CSI_LOG_LEVEL`` (INFO) when the
    process configured none, else the application's own, restored on return (see
    :mod:`kubevol.csidriver.server.logs`). Raises like :func:`serve_in_background`.
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        _log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    config = ServerConfig.from_env(effective_env(plugin, env))
    with driver_logging(config):
        previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
        try:
            handle = serve_in_background(
                plugin, endpoint, env=env, options=options, listener=listener
            )
            try:
                while not stop.wait(1.0):
                    pass
            finally:
                handle.stop(grace)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return 0
