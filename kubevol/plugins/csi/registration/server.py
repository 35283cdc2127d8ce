"""A registration socket for a CSI driver: the role of Kubernetes' node-driver-registrar.

The kubelet (or kubevol's :class:`~kubevol.plugins.csi.registration.PluginWatcher`) finds the
socket in ``<root>/plugins_registry/``, asks ``GetInfo`` and answers with
``NotifyRegistrationStatus``. Drivers served by kubevol's framework expose one with
:func:`serve_registration`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Protocol

import attrs
import grpc

# The generated module itself, not kubevol.csi._pb's Any: its stubs type the messages.
from kubevol.csi._generated import pluginregistration_pb2 as registration_pb2
from kubevol.csi.endpoint import Scheme, parse_endpoint
from kubevol.csi.unixsocket import UnixSocket, serve_on_unix_socket
from kubevol.layout import validate_path_segment
from kubevol.util.lifecycle import RunsWhileEntered

log = logging.getLogger(__name__)

#: The gRPC service the kubelet's plugin watcher speaks.
REGISTRATION_SERVICE = "pluginregistration.Registration"
#: The plugin type of CSI drivers.
CSI_PLUGIN_TYPE = "CSIPlugin"
#: What node-driver-registrar reports unless told otherwise.
DEFAULT_VERSIONS = ("1.0.0",)


@attrs.frozen(kw_only=True)
class RegistrationStatus:
    """What the watcher answered: registered or not, and why not."""

    registered: bool
    error: str = ""


def registration_socket_path(registry_dir: str, driver_name: str) -> str:
    """``<registry_dir>/<driver>-reg.sock``, node-driver-registrar's naming."""
    return os.path.join(registry_dir, validate_path_segment(f"{driver_name}-reg.sock", "socket"))


def _plain_endpoint(endpoint: str) -> str:
    """A unix endpoint as the bare path the kubelet dials; TCP endpoints unchanged."""
    parsed = parse_endpoint(endpoint)
    return parsed.address if parsed.scheme is Scheme.UNIX else str(parsed)


class RegistrationServer(RunsWhileEntered):
    """Serves ``GetInfo``/``NotifyRegistrationStatus`` for one driver on a unix socket.

    ``endpoint`` is the driver's CSI endpoint (sent as a bare path for unix sockets, as the
    kubelet expects). Start with :meth:`start` (or ``with``); :meth:`stop` removes the
    socket, which makes a watcher deregister the driver.
    """

    def __init__(
        self,
        *,
        driver_name: str,
        endpoint: str,
        socket_path: str,
        versions: Sequence[str] = DEFAULT_VERSIONS,
        plugin_type: str = CSI_PLUGIN_TYPE,
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = _plain_endpoint(endpoint)
        self.socket_path = os.path.abspath(socket_path)
        self.versions = tuple(versions)
        self.plugin_type = plugin_type
        self._server: grpc.Server | None = None
        self._socket: UnixSocket | None = None
        self._statuses: list[RegistrationStatus] = []
        self._changed = threading.Condition()

    # --- the service ------------------------------------------------------------------

    def _get_info(
        self, request: registration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type=self.plugin_type,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(self.versions),
        )

    def _notify(
        self, request: registration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> registration_pb2.RegistrationStatusResponse:
        status = RegistrationStatus(registered=request.plugin_registered, error=request.error)
        if status.registered:
            log.info("CSI driver %s registered with the node", self.driver_name)
        else:
            log.error("CSI driver %s registration failed: %s", self.driver_name, status.error)
        with self._changed:
            self._statuses.append(status)
            self._changed.notify_all()
        return registration_pb2.RegistrationStatusResponse()

    # --- status -----------------------------------------------------------------------

    @property
    def status(self) -> RegistrationStatus | None:
        """The last status the watcher sent, None before any."""
        with self._changed:
            return self._statuses[-1] if self._statuses else None

    def wait_for_status(self, timeout: float, *, count: int = 1) -> RegistrationStatus | None:
        """Block until ``count`` statuses have arrived (or ``timeout``); the last one."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._statuses) >= count, timeout)
            return self._statuses[-1] if self._statuses else None

    # --- life cycle -------------------------------------------------------------------

    def start(self) -> RegistrationServer:
        """Create the socket (mode 0600, appearing only once it serves) and serve. Raises
        :class:`~kubevol.csi.errors.CSIServeError` when a live socket or another file is in
        the way."""
        if self._server is not None:
            return self
        os.makedirs(os.path.dirname(self.socket_path), mode=0o750, exist_ok=True)
        handlers = {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                self._get_info,
                request_deserializer=registration_pb2.InfoRequest.FromString,
                response_serializer=registration_pb2.PluginInfo.SerializeToString,
            ),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                self._notify,
                request_deserializer=registration_pb2.RegistrationStatus.FromString,
                response_serializer=registration_pb2.RegistrationStatusResponse.SerializeToString,
            ),
        }
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg"))
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(REGISTRATION_SERVICE, handlers)]
        )
        self._socket = serve_on_unix_socket(server, self.socket_path, mode=0o600)
        self._server = server
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving and remove the socket (only while it is still this server's).
        Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()
        if self._socket is not None:
            self._socket.remove()
            self._socket = None


class ServedDriver(Protocol):
    """A served CSI driver (:class:`~kubevol.csidriver.server.ServerHandle`): its
    ``address`` is the CSI endpoint."""

    @property
    def address(self) -> object: ...


def serve_registration(
    handle: ServedDriver,
    driver_name: str,
    registry_dir: str,
    *,
    versions: Sequence[str] = DEFAULT_VERSIONS,
) -> RegistrationServer:
    """Expose a registration socket for a driver served by kubevol's framework.

    ``handle`` is the driver's :class:`~kubevol.csidriver.server.ServerHandle` (its ``address``
    is the CSI endpoint). The socket is ``<registry_dir>/<driver>-reg.sock``; the returned
    server is started; stop it before (or with) the driver.
    """
    return RegistrationServer(
        driver_name=driver_name,
        endpoint=str(handle.address),
        socket_path=registration_socket_path(registry_dir, driver_name),
        versions=versions,
    ).start()
