"""One registered plugin instance under supervision: its fingerprinter and its loop
(Nomad's ``instanceManager`` and ``pluginFingerprinter``).

Fingerprinting asks, on the first success only, GetPluginCapabilities and (node plugins)
NodeGetInfo, cached afterwards; and every time Probe plus NodeGetCapabilities or
ControllerGetCapabilities. ``requires_staging`` is latched on the first good fingerprint.

Shutdown is deterministic: once :meth:`InstanceManager.shutdown` starts, the loop reports
nothing more, in-flight calls are cancelled by closing the client, the loop thread is
joined, and one final fingerprint - made with the client closed, so without any call -
reports the plugin unhealthy (or undetected, if it never answered).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import attrs

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.nomad.errors import ManagerShutdownError
from kubevol.nomad.registry import PluginType, RegisteredPlugin
from kubevol.nomad.types import (
    ControllerFingerprint,
    CSIInfo,
    HealthState,
    NodeEvent,
    NodeFingerprint,
    TriggerNodeEvent,
    UpdateNodeCSIInfoFunc,
)

log = logging.getLogger(__name__)

#: Seconds between two fingerprints of one plugin (Nomad's managerFingerprintInterval).
DEFAULT_FINGERPRINT_INTERVAL = 30.0
#: Per-call timeout of fingerprint RPCs.
DEFAULT_FINGERPRINT_RPC_TIMEOUT = 10.0

#: Builds a client for a socket path.
ClientFactory = Callable[[str], CSIClient]


class _Closed(Exception):
    """The fingerprinter was closed; no call is made any more."""


class Fingerprinter:
    """Fingerprints one plugin instance. Not for concurrent :meth:`fingerprint` calls;
    :meth:`close` may come from any thread and cancels a call in flight."""

    def __init__(
        self,
        plugin: RegisteredPlugin,
        client_factory: ClientFactory,
        rpc_timeout: float,
        *,
        logger: logging.Logger | None = None,
    ) -> None:
        self.plugin = plugin
        self._log = logger if logger is not None else log
        self._client_factory = client_factory
        self._rpc_timeout = rpc_timeout
        self._lock = threading.Lock()
        self._client: CSIClient | None = None
        self._closed = False
        self._basic: CSIInfo | None = None
        self._answered = False
        self.first_success = threading.Event()
        self._requires_staging = False

    @property
    def requires_staging(self) -> bool:
        """Whether the first good fingerprint saw STAGE_UNSTAGE_VOLUME (False before it)."""
        return self._requires_staging

    def close(self) -> None:
        """Close the client (cancelling a call in flight) and refuse further calls.
        Idempotent."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _get_client(self) -> CSIClient:
        with self._lock:
            if self._closed:
                raise _Closed
            if self._client is None:
                self._client = self._client_factory(self.plugin.socket_path)
            return self._client

    def _drop_client(self, client: CSIClient) -> None:
        """Forget a client after a failure, so the next fingerprint reconnects afresh
        (a restarted plugin on the same socket is then found at once, without waiting
        out gRPC's reconnect backoff)."""
        with self._lock:
            if self._client is client:
                self._client = None
        client.close()

    def _empty_info(self) -> CSIInfo:
        node = NodeFingerprint() if self.plugin.type is PluginType.CSI_NODE else None
        controller = (
            ControllerFingerprint() if self.plugin.type is PluginType.CSI_CONTROLLER else None
        )
        return CSIInfo(
            plugin_id=self.plugin.name,
            plugin_type=self.plugin.type.value,
            alloc_id=self.plugin.alloc_id,
            provider=self.plugin.options.get("provider", ""),
            provider_version=self.plugin.version,
            health=HealthState.UNDETECTED,
            health_description="initial fingerprint not completed",
            node_info=node,
            controller_info=controller,
        )

    def _failed(self, base: CSIInfo, description: str) -> CSIInfo:
        health = HealthState.UNHEALTHY if self._answered else HealthState.UNDETECTED
        return attrs.evolve(base, health=health, health_description=description)

    def fingerprint(self) -> CSIInfo:
        """Fingerprint the plugin once; never raises (failures are reported as health).

        After :meth:`close` it makes no call and reports the plugin unhealthy
        (undetected if it never answered).
        """
        base = self._basic or self._empty_info()
        try:
            client = self._get_client()
        except _Closed:
            return self._failed(base, "plugin instance shut down")
        except Exception as exc:
            return self._failed(base, f"cannot connect to plugin: {exc}")
        try:
            if self._basic is None:
                self._basic = self._basic_fingerprint(client)
                base = self._basic
            info = self._health_fingerprint(client, base)
        except Exception as exc:
            # CSIRPCError is the expected failure; anything else (an answer kubevol cannot
            # read) is logged, and the loop lives on to fingerprint again.
            if not isinstance(exc, CSIRPCError):
                self._log.exception("unexpected failure fingerprinting plugin %s", self.plugin.name)
            self._drop_client(client)
            if self._is_closed():
                return self._failed(base, "plugin instance shut down")
            what = "initial fingerprint" if self._basic is None else "fingerprinting"
            return self._failed(base, f"failed {what} with error: {exc}")
        if not self.first_success.is_set():
            if info.node_info is not None:
                self._requires_staging = info.node_info.requires_node_stage_volume
            self.first_success.set()
        return info

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _basic_fingerprint(self, client: CSIClient) -> CSIInfo:
        info = self._empty_info()
        caps = client.get_plugin_capabilities(timeout=self._rpc_timeout)
        self._answered = True
        info = attrs.evolve(
            info,
            requires_controller_plugin=t.PluginServiceType.CONTROLLER_SERVICE in caps.services,
            requires_topologies=(
                t.PluginServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS in caps.services
            ),
        )
        if self.plugin.type is PluginType.CSI_NODE:
            node = client.node_get_info(timeout=self._rpc_timeout)
            info = attrs.evolve(
                info,
                node_info=NodeFingerprint(
                    node_id=node.node_id,
                    max_volumes=node.max_volumes_per_node,
                    accessible_topology=node.accessible_topology,
                ),
            )
        return info

    def _health_fingerprint(self, client: CSIClient, base: CSIInfo) -> CSIInfo:
        ready = client.probe(timeout=self._rpc_timeout)
        self._answered = True
        if self.plugin.type is PluginType.CSI_NODE:
            node_caps = client.node_get_capabilities(refresh=True, timeout=self._rpc_timeout)
            old = base.node_info or NodeFingerprint()
            base = attrs.evolve(
                base,
                node_info=NodeFingerprint(
                    node_id=old.node_id,
                    max_volumes=old.max_volumes,
                    accessible_topology=old.accessible_topology,
                    capabilities=node_caps,
                ),
            )
        else:
            ctrl_caps = client.controller_get_capabilities(timeout=self._rpc_timeout)
            base = attrs.evolve(base, controller_info=ControllerFingerprint(capabilities=ctrl_caps))
        if ready:
            return attrs.evolve(base, health=HealthState.HEALTHY, health_description="healthy")
        return attrs.evolve(
            base, health=HealthState.UNHEALTHY, health_description="plugin not ready"
        )


class InstanceManager:
    """Runs the fingerprint loop of one plugin instance on its own thread.

    Each fingerprint goes to ``update_info(name, info)``; a change of health also sends a
    ``CSI`` :class:`~kubevol.nomad.types.NodeEvent` to ``trigger_node_event``.
    Callback exceptions are logged (to ``logger``, default this module's), never fatal.
    """

    def __init__(
        self,
        plugin: RegisteredPlugin,
        *,
        logger: logging.Logger | None = None,
        update_info: UpdateNodeCSIInfoFunc | None = None,
        trigger_node_event: TriggerNodeEvent | None = None,
        fingerprint_interval: float = DEFAULT_FINGERPRINT_INTERVAL,
        rpc_timeout: float = DEFAULT_FINGERPRINT_RPC_TIMEOUT,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.plugin = plugin
        self._log = logger if logger is not None else log
        self.fingerprint_interval = fingerprint_interval
        self._update_info = update_info
        self._trigger_node_event = trigger_node_event
        factory = client_factory or (lambda path: CSIClient(path, timeout=rpc_timeout))
        self._client_factory: ClientFactory = factory
        self._fp = Fingerprinter(plugin, factory, rpc_timeout, logger=self._log)
        #: Set when shutdown starts: loops, retries and waiters stop on it.
        self.cancelled = threading.Event()
        self._wake = threading.Event()
        self._report_lock = threading.Lock()
        self._shutdown_lock = threading.Lock()
        self._stopping = False
        self._done = False
        self._latest: CSIInfo | None = None
        self._first_report = threading.Event()
        self._reported_health: HealthState | None = None
        self._thread: threading.Thread | None = None
        self._volume_client: CSIClient | None = None
        self._client_lock = threading.Lock()

    # --- state ----------------------------------------------------------------------

    @property
    def latest(self) -> CSIInfo | None:
        """The last fingerprint reported (None before the first)."""
        with self._report_lock:
            return self._latest

    @property
    def requires_staging(self) -> bool:
        """Latched from the first good fingerprint."""
        return self._fp.requires_staging

    def wait_first_fingerprint(self, timeout: float | None) -> bool:
        """Wait for the first good fingerprint; True when it happened."""
        return self._fp.first_success.wait(timeout)

    def wait_first_report(self, timeout: float | None) -> bool:
        """Wait until a first fingerprint was reported, healthy or not; True when it was."""
        return self._first_report.wait(timeout)

    def volume_client(self) -> CSIClient:
        """The client volume operations use (one per instance, closed on shutdown).

        Raises :class:`~kubevol.nomad.errors.ManagerShutdownError` once shut down.
        """
        with self._client_lock:
            if self.cancelled.is_set():
                raise ManagerShutdownError(f"plugin {self.plugin.name!r} instance is shut down")
            if self._volume_client is None:
                self._volume_client = self._client_factory(self.plugin.socket_path)
            return self._volume_client

    # --- loop -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread (fingerprinting at once). Idempotent."""
        with self._report_lock:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(
                target=self._run,
                name=f"csi-fingerprint-{self.plugin.type.value}-{self.plugin.name}",
                daemon=True,
            )
            self._thread.start()

    def trigger(self) -> None:
        """Fingerprint soon, without waiting for the interval."""
        self._wake.set()

    def _run(self) -> None:
        while not self.cancelled.is_set():
            info = self._fp.fingerprint()
            with self._report_lock:
                # A shutdown that began while the calls were in flight owns the last
                # word: this result is dropped so it cannot follow the final report.
                if self._stopping:
                    return
                self._report(info)
            self._wake.wait(self.fingerprint_interval)
            self._wake.clear()

    def _report(self, info: CSIInfo) -> None:
        """Record and send ``info``; the caller holds ``_report_lock``."""
        self._latest = info
        self._first_report.set()
        previous, self._reported_health = self._reported_health, info.health
        if self._update_info is not None:
            try:
                self._update_info(self.plugin.name, info)
            except Exception:
                self._log.exception("CSI info callback failed for plugin %s", self.plugin.name)
        if previous is not info.health and self._trigger_node_event is not None:
            event = NodeEvent(
                subsystem="CSI",
                message=f"CSI plugin {self.plugin.name} is {info.health.value}",
                details={
                    "plugin": self.plugin.name,
                    "type": self.plugin.type.value,
                    "alloc_id": self.plugin.alloc_id,
                    "health": info.health.value,
                    "description": info.health_description,
                },
            )
            try:
                self._trigger_node_event(event)
            except Exception:
                self._log.exception("node event callback failed for plugin %s", self.plugin.name)

    def shutdown(self) -> CSIInfo:
        """Stop for good and return the final (unhealthy) fingerprint. Idempotent.

        When it returns, the loop thread has exited, no call to the plugin is in flight
        or will be made by this instance, and the final fingerprint was the last report.
        """
        with self._shutdown_lock:
            if self._done:
                final = self.latest
                assert final is not None  # set below before _done
                return final
            with self._report_lock:
                self._stopping = True
            self.cancelled.set()
            self._wake.set()
            self._fp.close()
            with self._client_lock:
                client, self._volume_client = self._volume_client, None
            if client is not None:
                client.close()
            if self._thread is not None:
                self._thread.join()
            final = self._fp.fingerprint()
            with self._report_lock:
                self._report(final)
            self._done = True
            return final
