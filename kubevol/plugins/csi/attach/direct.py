"""Attach by calling the driver's ControllerPublishVolume/ControllerUnpublishVolume from the
node itself, for nodes with no API server (Nomad's model).

The CSI node id comes from the ``NodeGetInfo`` answer the registry kept at registration. A
driver that does not advertise PUBLISH_UNPUBLISH_VOLUME needs no attaching: attach and
detach do nothing and the publish context is empty. Publish contexts are kept in memory;
after a restart they are obtained again by publishing again, which the spec makes
idempotent (same volume, node and capability: same answer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import grpc

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.errors import OperationError
from kubevol.plugins.csi.attach.base import AttachBackend, AttachRequest, attachment_name
from kubevol.plugins.csi.registration.registry import (
    DriverNotRegisteredError,
    DriverRegistry,
    RegisteredDriver,
)

log = logging.getLogger(__name__)


class DirectAttachBackend(AttachBackend):
    """Attachment through the driver's own controller service.

    ``controller_endpoints`` maps a driver name to the endpoint of its controller service
    when that is not the registered (node) endpoint; ``controller_timeout`` bounds each
    controller call.
    """

    def __init__(
        self,
        registry: DriverRegistry,
        *,
        controller_endpoints: Mapping[str, str] | None = None,
        client_factory: Callable[[str], CSIClient] | None = None,
    ) -> None:
        self.registry = registry
        self._endpoints = dict(controller_endpoints or {})
        self._factory = client_factory or CSIClient
        self._own_clients: dict[str, CSIClient] = {}
        self._caps: dict[tuple[str, str], frozenset[t.ControllerCapability]] = {}
        self._published: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        # A driver that registers again may come back with other capabilities.
        registry.add_listener(self._registry_changed)

    def _registry_changed(self, event: str, driver: RegisteredDriver) -> None:
        """Forget what a driver that (de)registers said, and ask one that registers what it
        says now, while it registers: whether attaching means anything for its volumes is
        then known without a call (:meth:`attaches_known`), as a restarted node asks for
        every volume it finds. A separate controller endpoint is asked when needed."""
        with self._lock:
            for key in [k for k in self._caps if k[0] == driver.name]:
                del self._caps[key]
        if event != "registered" or driver.name in self._endpoints:
            return
        try:
            self._ask_capabilities(driver.name, timeout=self.registry.node_info_timeout)
        except Exception as exc:  # asked again when needed; registration stands
            log.debug("ControllerGetCapabilities of %s at registration: %s", driver.name, exc)

    def close(self) -> None:
        """Close the clients this backend opened for separate controller endpoints."""
        with self._lock:
            clients, self._own_clients = list(self._own_clients.values()), {}
        for client in clients:
            client.close()

    def _client(self, driver: str) -> tuple[CSIClient, str]:
        endpoint = self._endpoints.get(driver)
        if endpoint is None:
            return self.registry.client(driver), self.registry.get(driver).endpoint
        with self._lock:
            client = self._own_clients.get(endpoint)
            if client is None:
                client = self._own_clients[endpoint] = self._factory(endpoint)
        return client, endpoint

    def _endpoint(self, driver: str) -> str:
        """Where the driver's controller service is: its own endpoint, else the one it
        registered. Raises :class:`DriverNotRegisteredError`."""
        return self._endpoints.get(driver) or self.registry.get(driver).endpoint

    def controller_capabilities(self, driver: str) -> frozenset[t.ControllerCapability]:
        """The driver's controller capabilities (asked once per endpoint)."""
        key = (driver, self._endpoint(driver))
        with self._lock:
            cached = self._caps.get(key)
        return cached if cached is not None else self._ask_capabilities(driver)

    def _ask_capabilities(
        self, driver: str, *, timeout: float | None = None
    ) -> frozenset[t.ControllerCapability]:
        client, endpoint = self._client(driver)
        try:
            caps = client.controller_get_capabilities(timeout=timeout)
        except CSIRPCError as exc:
            if exc.code is not grpc.StatusCode.UNIMPLEMENTED:
                raise
            caps = frozenset()  # a node-only driver has no controller service
        with self._lock:
            self._caps[(driver, endpoint)] = caps
        return caps

    def attaches(self, driver: str) -> bool:
        return t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME in self.controller_capabilities(
            driver
        )

    def attaches_known(self, driver: str) -> bool | None:
        try:
            key = (driver, self._endpoint(driver))
        except DriverNotRegisteredError:
            return None
        with self._lock:
            caps = self._caps.get(key)
        return None if caps is None else t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME in caps

    def _publish(self, request: AttachRequest) -> dict[str, str]:
        client, _ = self._client(request.driver)
        node_id = self.registry.get(request.driver).node_info.node_id
        context = client.controller_publish_volume(
            request.volume_handle,
            node_id,
            request.capability,
            readonly=request.read_only,
            secrets=request.secrets,
            volume_context=request.volume_context,
        )
        with self._lock:
            self._published[request.attachment_id] = dict(context)
        log.info("ControllerPublishVolume %s on %s (node id %s) done",
                 request.volume_handle, request.node_name, node_id)
        return dict(context)

    def attach(self, request: AttachRequest, *, timeout: float) -> None:
        if self.attaches(request.driver):
            self._publish(request)

    def _known(self, request: AttachRequest) -> dict[str, str] | None:
        with self._lock:
            found = self._published.get(request.attachment_id)
        return None if found is None else dict(found)

    def wait_for_attach(self, request: AttachRequest) -> str:
        if self.attaches(request.driver) and self._known(request) is None:
            # Not published by this process (restarted?): publishing again is idempotent.
            self._publish(request)
        return request.attachment_id

    def is_attached(self, request: AttachRequest) -> bool:
        try:
            return not self.attaches(request.driver) or self._known(request) is not None
        except Exception as exc:  # "is it attached?" must not fail the caller
            log.warning("cannot tell whether %s is attached: %s", request.volume_handle, exc)
            return False

    def publish_context(self, request: AttachRequest) -> dict[str, str]:
        if not self.attaches(request.driver):
            return {}
        known = self._known(request)
        return known if known is not None else self._publish(request)

    def detach(self, driver: str, volume_handle: str, node_name: str, *, timeout: float) -> None:
        if not self.attaches(driver):
            return
        client, _ = self._client(driver)
        node_id = self.registry.get(driver).node_info.node_id
        try:
            client.controller_unpublish_volume(volume_handle, node_id)
        except CSIRPCError as exc:
            # The spec lets a driver answer NOT_FOUND for a volume it no longer knows:
            # there is nothing attached any more.
            if exc.code is not grpc.StatusCode.NOT_FOUND:
                raise OperationError(
                    f"ControllerUnpublishVolume of {volume_handle} from {node_name} failed: {exc}"
                ) from exc
        with self._lock:
            self._published.pop(attachment_name(volume_handle, driver, node_name), None)
