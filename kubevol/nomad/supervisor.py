"""Supervising a workload that *is* a CSI plugin (Nomad's ``csi_plugin`` stanza and its
``csi_plugin_supervisor`` task hook).

The agent calls :meth:`PluginSupervisor.prepare` before starting the plugin task (the mount
root must exist so it can be bind-mounted into the task, and be a shared mount so that the
plugin's mounts inside it reach the host: see :mod:`kubevol.nomad.propagation`), mounts
:meth:`PluginSupervisor.task_mounts` into the task with their propagation, then calls
:meth:`PluginSupervisor.start` once the task runs. The supervisor waits for the plugin's
socket, probes it every ``probe_interval`` until it answers ready or ``health_timeout``
passes (then it reports the failure through ``on_health_timeout``, where Nomad restarts the
task), registers it in the registry, and heartbeats every ``heartbeat_interval``, emitting a
task event each time the health flips. :meth:`PluginSupervisor.stop` deregisters it.
"""

from __future__ import annotations

import enum
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping

import attrs

from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.errors import MountError
from kubevol.nomad.claims import ALLOC_DIR_NAME, STAGING_DIR_NAME
from kubevol.nomad.errors import PluginUnhealthyError
from kubevol.nomad.instance import ClientFactory
from kubevol.nomad.propagation import MountPropagation, make_rshared
from kubevol.nomad.registry import PluginRegistry, PluginType, RegisteredPlugin

log = logging.getLogger(__name__)

#: Seconds between probes while waiting for a new plugin to turn healthy.
DEFAULT_PROBE_INTERVAL = 5.0
#: Seconds a new plugin has to answer a healthy Probe.
DEFAULT_HEALTH_TIMEOUT = 30.0
#: Seconds between two heartbeats of a registered plugin.
DEFAULT_HEARTBEAT_INTERVAL = 30.0
#: Per-Probe timeout (seconds).
DEFAULT_PROBE_TIMEOUT = 5.0
#: The plugin's socket file name under its mount root when none is given.
SOCKET_NAME = "csi.sock"


class TaskEventType(enum.StrEnum):
    """Task events the supervisor emits (Nomad's ``TaskPluginHealthy``/``Unhealthy``)."""

    PLUGIN_HEALTHY = "Plugin became healthy"
    PLUGIN_UNHEALTHY = "Plugin became unhealthy"


@attrs.frozen(kw_only=True)
class TaskEvent:
    """One health event of a supervised plugin task."""

    type: TaskEventType
    message: str
    timestamp: float = attrs.field(factory=time.time)


def _positive(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen(kw_only=True)
class PluginTaskConfig:
    """The ``csi_plugin`` stanza of a task, plus the host paths the agent chose.

    ``socket_path`` defaults to ``<mount_root>/csi.sock``. Intervals are in seconds.
    ``mount_propagation`` is how the task sees the mount root (default bidirectional, which
    a node plugin needs; the host side is then made ``rshared`` by ``prepare``).
    """

    plugin_id: str
    plugin_type: PluginType = attrs.field(converter=PluginType)
    alloc_id: str
    mount_root: str
    plugin_mount_root: str = ""
    socket_path: str = ""
    version: str = ""
    options: Mapping[str, str] = attrs.field(factory=dict)
    health_timeout: float = attrs.field(default=DEFAULT_HEALTH_TIMEOUT, validator=_positive)
    probe_interval: float = attrs.field(default=DEFAULT_PROBE_INTERVAL, validator=_positive)
    heartbeat_interval: float = attrs.field(default=DEFAULT_HEARTBEAT_INTERVAL, validator=_positive)
    probe_timeout: float = attrs.field(default=DEFAULT_PROBE_TIMEOUT, validator=_positive)
    mount_propagation: MountPropagation = attrs.field(
        default=MountPropagation.BIDIRECTIONAL, converter=MountPropagation
    )

    def registration(self) -> RegisteredPlugin:
        """The registry entry for this plugin (validates names and paths)."""
        return RegisteredPlugin(
            type=self.plugin_type,
            name=self.plugin_id,
            alloc_id=self.alloc_id,
            socket_path=self.socket_path or os.path.join(self.mount_root, SOCKET_NAME),
            mount_root=self.mount_root,
            plugin_mount_root=self.plugin_mount_root,
            version=self.version,
            options=self.options,
        )


@attrs.frozen(kw_only=True)
class TaskMount:
    """A mount the task runtime must give the plugin's task: ``host_path`` at
    ``task_path`` with ``propagation`` (OCI name: ``propagation.runtime_name``)."""

    host_path: str
    task_path: str
    propagation: MountPropagation


class PluginSupervisor:
    """Supervises one plugin task; see the module docstring. Thread-safe.

    ``on_event`` receives :class:`TaskEvent` s; ``on_health_timeout`` receives the
    :class:`~kubevol.nomad.errors.PluginUnhealthyError` when the plugin did not turn
    healthy in time. Callback exceptions are logged (to ``logger``, default this module's),
    never fatal.
    """

    def __init__(
        self,
        config: PluginTaskConfig,
        registry: PluginRegistry,
        *,
        on_event: Callable[[TaskEvent], None] | None = None,
        on_health_timeout: Callable[[PluginUnhealthyError], None] | None = None,
        client_factory: ClientFactory | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self._log = logger if logger is not None else log
        self.plugin = config.registration()
        self.registry = registry
        self._on_event = on_event
        self._on_health_timeout = on_health_timeout
        self._client_factory: ClientFactory = client_factory or (
            lambda path: CSIClient(path, timeout=config.probe_timeout)
        )
        self._cancel = threading.Event()
        self._registered = threading.Event()
        self._lock = threading.Lock()
        self._client: CSIClient | None = None
        self._thread: threading.Thread | None = None
        self._healthy: bool | None = None
        self.error: PluginUnhealthyError | None = None

    @property
    def healthy(self) -> bool | None:
        """The last heartbeat's verdict (None before the plugin first turned healthy)."""
        with self._lock:
            return self._healthy

    @property
    def registered(self) -> bool:
        """Whether the plugin is registered by this supervisor."""
        return self._registered.is_set()

    def wait_registered(self, timeout: float | None = None) -> bool:
        """Wait until the plugin turned healthy and was registered."""
        return self._registered.wait(timeout)

    def prepare(self) -> None:
        """Create the mount root with its ``staging`` and ``per-alloc`` directories and the
        socket's directory (mode 0700) and, unless the task's propagation is ``private``,
        make the mount root an ``rshared`` mount (binding it on itself if needed; the bind
        stays after :meth:`stop`, with the volumes under it). Idempotent; raises
        :class:`~kubevol.errors.MountError` naming a directory that cannot be created or
        made shared."""
        dirs = [
            self.plugin.mount_root,
            os.path.join(self.plugin.mount_root, STAGING_DIR_NAME),
            os.path.join(self.plugin.mount_root, ALLOC_DIR_NAME),
            os.path.dirname(self.plugin.socket_path),
        ]
        for path in dirs:
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise MountError(
                    exc.errno, f"cannot create plugin directory {path!r}: {exc.strerror}"
                ) from exc
        private = self.config.mount_propagation is MountPropagation.PRIVATE
        if not private and make_rshared(self.plugin.mount_root):
            self._log.info("bound %s on itself to share its mounts", self.plugin.mount_root)

    def task_mounts(self) -> list[TaskMount]:
        """What the task runtime mounts into the plugin's task: the mount root at the
        plugin's view of it, with the configured propagation (Nomad's hook adds this
        mount to the task)."""
        return [
            TaskMount(
                host_path=self.plugin.mount_root,
                task_path=self.plugin.plugin_root,
                propagation=self.config.mount_propagation,
            )
        ]

    def start(self) -> None:
        """Prepare the directories and start supervising on a thread. Idempotent."""
        self.prepare()
        with self._lock:
            if self._thread is not None or self._cancel.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name=f"csi-supervisor-{self.plugin.name}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop supervising, wait for the loop to exit and deregister the plugin.
        Idempotent."""
        self._cancel.set()
        with self._lock:
            client, self._client = self._client, None
            thread = self._thread
        if client is not None:
            client.close()
        if thread is not None:
            thread.join()
        if self._registered.is_set():
            self.registry.deregister(self.plugin.type, self.plugin.name, self.plugin.alloc_id)
            self._registered.clear()

    # --- the loop -------------------------------------------------------------------

    def _run(self) -> None:
        if not self._wait_healthy():
            return
        try:
            self.registry.register(self.plugin)
        except Exception as exc:
            self._log.exception("cannot register plugin %s", self.plugin.name)
            self._fail(PluginUnhealthyError(f"cannot register plugin {self.plugin.name!r}: {exc}"))
            return
        self._registered.set()
        self._set_health(True)
        while not self._cancel.wait(self.config.heartbeat_interval):
            self._set_health(self._probe())

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + self.config.health_timeout
        while not self._cancel.is_set():
            if self._probe():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                where = self.plugin.socket_path
                state = "answered not ready" if _is_socket(where) else f"no socket at {where}"
                self._fail(
                    PluginUnhealthyError(
                        f"plugin {self.plugin.name!r} did not become healthy within "
                        f"{self.config.health_timeout:g}s ({state})"
                    )
                )
                return False
            self._cancel.wait(min(self.config.probe_interval, remaining))
        return False

    def _fail(self, error: PluginUnhealthyError) -> None:
        self.error = error
        self._emit(TaskEventType.PLUGIN_UNHEALTHY, str(error))
        if self._on_health_timeout is not None:
            try:
                self._on_health_timeout(error)
            except Exception:
                self._log.exception(
                    "health timeout callback failed for plugin %s", self.plugin.name
                )

    def _probe(self) -> bool:
        """One Probe; any failure is "not healthy". A failed client is dropped so the next
        probe reconnects (a restarted plugin is found at once)."""
        if not _is_socket(self.plugin.socket_path):
            return False
        with self._lock:
            if self._cancel.is_set():
                return False
            if self._client is None:
                self._client = self._client_factory(self.plugin.socket_path)
            client = self._client
        try:
            return client.probe(timeout=self.config.probe_timeout)
        except CSIRPCError as exc:
            self._log.debug("probe of %s failed: %s", self.plugin.name, exc)
            with self._lock:
                if self._client is client:
                    self._client = None
            client.close()
            return False

    def _set_health(self, healthy: bool) -> None:
        with self._lock:
            previous, self._healthy = self._healthy, healthy
        if previous is healthy or self._cancel.is_set():
            return
        if healthy:
            self._emit(TaskEventType.PLUGIN_HEALTHY, f"plugin {self.plugin.name}: probe succeeded")
        else:
            self._emit(TaskEventType.PLUGIN_UNHEALTHY, f"plugin {self.plugin.name}: probe failed")

    def _emit(self, kind: TaskEventType, message: str) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(TaskEvent(type=kind, message=message))
        except Exception:
            self._log.exception("task event callback failed for plugin %s", self.plugin.name)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False
