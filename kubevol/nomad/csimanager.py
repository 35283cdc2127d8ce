"""The CSI plugin manager (Nomad's ``csimanager``): one instance manager per registered
plugin, kept in step with the registry by its events and a periodic resync, and the entry
point to a plugin's volume mounter.

Lifecycle::

    mgr = CSIManager(registry, update_node_csi_info=..., trigger_node_event=...,
                     state_dir="/var/lib/agent/csi", logger=agent_log)
    # or CSIManager.from_config(ManagerConfig(registry=registry, ...)), Nomad's New(config)
    mgr.run()                                   # resync now, then follow the registry
    mgr.wait_for_first_fingerprint(30)          # what the node fingerprinter waits for
    mounter = mgr.mounter_for_plugin("hostpath")
    info = mounter.mount_volume(volume, alloc_id, usage)
    ...
    mgr.shutdown()                              # deterministic, see shutdown()

By default shutting down never unmounts volumes: an agent restart must leave allocations'
volumes in place, and the next manager picks up the registry and the usage claims from
``state_dir``. Nomad's interface documents the opposite ("Shutdown ... unmounts any locally
attached volumes"); ``unmount_on_shutdown=True`` asks for that, for an agent that drains
its node for good: every volume this manager's claims know of is unpublished and unstaged
first (:meth:`CSIManager.unmount_all`), volumes it never mounted are left alone.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import attrs

from kubevol.errors import PluginNotFoundError
from kubevol.layout import validate_path_segment
from kubevol.mount.interface import MountInterface
from kubevol.mount.linux import LinuxMounter
from kubevol.nomad.attachment import AttachmentSource, AttachmentWaiter
from kubevol.nomad.claims import UsageTracker, VolumeKey
from kubevol.nomad.errors import ManagerShutdownError, PluginWaitTimeoutError
from kubevol.nomad.instance import (
    DEFAULT_FINGERPRINT_INTERVAL,
    DEFAULT_FINGERPRINT_RPC_TIMEOUT,
    ClientFactory,
    InstanceManager,
)
from kubevol.nomad.interface import (
    CSI_PLUGIN_MANAGER_TYPE,
    Manager,
    PluginManager,
)
from kubevol.nomad.registry import (
    EventSubscription,
    PluginRegistry,
    PluginType,
    RegisteredPlugin,
)
from kubevol.nomad.types import (
    CSIInfo,
    HealthState,
    TriggerNodeEvent,
    UpdateNodeCSIInfoFunc,
    UsageOptions,
)
from kubevol.nomad.volumes import PluginVolumeState, RetryPolicy, VolumeManager

log = logging.getLogger(__name__)

#: Seconds between two full resyncs with the registry (Nomad's defaultPluginResyncPeriod).
DEFAULT_RESYNC_PERIOD = 30.0
#: How long ``mounter_for_plugin`` waits for a plugin's first good fingerprint.
DEFAULT_MOUNTER_WAIT = 60.0

#: How often mounter_for_plugin looks for an instance the run loop is starting (seconds).
_INSTANCE_POLL = 0.01

_Key = tuple[PluginType, str]


def _module_logger() -> logging.Logger:
    return log


@attrs.frozen(kw_only=True)
class ManagerConfig:
    """Everything a :class:`CSIManager` is built from (Nomad's ``csimanager.Config``).

    ``logger`` receives the manager's, its instance managers' and its volume managers'
    records (default: this module's logger). ``unmount_on_shutdown`` makes
    :meth:`CSIManager.shutdown` unmount the volumes it knows of (default: keep them).
    """

    registry: PluginRegistry
    logger: logging.Logger = attrs.field(factory=_module_logger)
    update_node_csi_info: UpdateNodeCSIInfoFunc | None = None
    trigger_node_event: TriggerNodeEvent | None = None
    resync_period: float = DEFAULT_RESYNC_PERIOD
    fingerprint_interval: float = DEFAULT_FINGERPRINT_INTERVAL
    rpc_timeout: float = DEFAULT_FINGERPRINT_RPC_TIMEOUT
    state_dir: str | None = None
    mounter: MountInterface | None = None
    client_factory: ClientFactory | None = None
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    unmount_on_shutdown: bool = False


@attrs.frozen(kw_only=True)
class UnmountFailure:
    """A volume :meth:`CSIManager.unmount_all` could not unmount, left as it was."""

    plugin_id: str
    key: VolumeKey | None
    alloc_id: str
    error: str


class CSIManager(Manager, PluginManager):
    """Supervises every plugin in ``registry``. Thread-safe.

    ``update_node_csi_info(name, info)`` receives every fingerprint (Nomad's
    ``UpdateNodeCSIInfoFunc``); ``trigger_node_event(event)`` receives health transitions
    and mount results. ``state_dir`` holds the usage claims (``usage/<plugin>.json``); without
    it claims live in memory and are rebuilt from the per-allocation mounts on start.
    ``mounter`` answers mount-point questions (default :class:`~kubevol.mount.LinuxMounter`).
    ``logger`` and ``unmount_on_shutdown``: see :class:`ManagerConfig`, which
    :attr:`config` holds and :meth:`from_config` builds from.

    It is its own :class:`~kubevol.nomad.interface.PluginManager` (:meth:`plugin_manager`).
    """

    def __init__(
        self,
        registry: PluginRegistry,
        *,
        update_node_csi_info: UpdateNodeCSIInfoFunc | None = None,
        trigger_node_event: TriggerNodeEvent | None = None,
        resync_period: float = DEFAULT_RESYNC_PERIOD,
        fingerprint_interval: float = DEFAULT_FINGERPRINT_INTERVAL,
        rpc_timeout: float = DEFAULT_FINGERPRINT_RPC_TIMEOUT,
        state_dir: str | None = None,
        mounter: MountInterface | None = None,
        client_factory: ClientFactory | None = None,
        retry: RetryPolicy | None = None,
        logger: logging.Logger | None = None,
        unmount_on_shutdown: bool = False,
    ) -> None:
        self.config = ManagerConfig(
            registry=registry,
            logger=logger if logger is not None else log,
            update_node_csi_info=update_node_csi_info,
            trigger_node_event=trigger_node_event,
            resync_period=resync_period,
            fingerprint_interval=fingerprint_interval,
            rpc_timeout=rpc_timeout,
            state_dir=state_dir,
            mounter=mounter,
            client_factory=client_factory,
            retry=retry or RetryPolicy(),
            unmount_on_shutdown=unmount_on_shutdown,
        )
        self.registry = registry
        self.resync_period = resync_period
        self.fingerprint_interval = fingerprint_interval
        self.rpc_timeout = rpc_timeout
        self.state_dir = state_dir
        self.retry = self.config.retry
        self._log = self.config.logger
        self._update_info = update_node_csi_info
        self._trigger_node_event = trigger_node_event
        self._client_factory = client_factory
        self._mounter = mounter if mounter is not None else LinuxMounter()
        self._lock = threading.RLock()
        self._instances: dict[_Key, InstanceManager] = {}
        self._volume_states: dict[str, PluginVolumeState] = {}
        self._volume_managers: dict[InstanceManager, VolumeManager] = {}
        self._cancel = threading.Event()
        self._shutdown_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._subscription: EventSubscription | None = None
        self._stopped = False

    @classmethod
    def from_config(cls, config: ManagerConfig) -> CSIManager:
        """A manager built from ``config`` (Nomad's ``csimanager.New``)."""
        return cls(
            config.registry,
            update_node_csi_info=config.update_node_csi_info,
            trigger_node_event=config.trigger_node_event,
            resync_period=config.resync_period,
            fingerprint_interval=config.fingerprint_interval,
            rpc_timeout=config.rpc_timeout,
            state_dir=config.state_dir,
            mounter=config.mounter,
            client_factory=config.client_factory,
            retry=config.retry,
            logger=config.logger,
            unmount_on_shutdown=config.unmount_on_shutdown,
        )

    # --- the plugin manager face -----------------------------------------------------

    def plugin_manager(self) -> PluginManager:
        """This manager, as the node fingerprinter sees it."""
        return self

    @property
    def plugin_type(self) -> str:
        """``"csi"``."""
        return CSI_PLUGIN_MANAGER_TYPE

    def wait_for_first_fingerprint(self, timeout: float | None) -> bool:
        """Wait until every plugin instance running now reported its first fingerprint,
        healthy or not (:meth:`run` starts one for every registered plugin before it
        returns). True when all did within ``timeout`` seconds (None: no limit)."""
        with self._lock:
            instances = list(self._instances.values())
        deadline = None if timeout is None else time.monotonic() + timeout
        for inst in instances:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not inst.wait_first_report(remaining):
                return False
        return True

    def attachment_waiter(self, source: AttachmentSource) -> AttachmentWaiter:
        """An :class:`~kubevol.nomad.attachment.AttachmentWaiter` on ``source`` that waits
        up to the mount action's timeout (``retry.timeout``) and is cancelled when this
        manager shuts down."""
        return AttachmentWaiter(
            source, timeout=self.retry.timeout, cancel=self._cancel, logger=self._log
        )

    # --- lifecycle ------------------------------------------------------------------

    def run(self) -> None:
        """Start: subscribe to the registry, resync once (instances exist when this
        returns), then follow registry events and resync every ``resync_period`` on a
        thread. Idempotent. Raises ``ManagerShutdownError`` after :meth:`shutdown`."""
        with self._shutdown_lock:
            if self._stopped:
                raise ManagerShutdownError("the CSI manager was shut down")
            if self._thread is not None:
                return
            # Subscribe before the first resync: an event in between is then seen twice
            # (harmless) rather than lost.
            self._subscription = self.registry.subscribe()
            self._resync()
            self._thread = threading.Thread(target=self._loop, name="csi-manager", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        sub = self._subscription
        assert sub is not None  # set by run() before the thread starts
        next_resync = time.monotonic() + self.resync_period
        while not self._cancel.is_set():
            event = sub.get(timeout=max(0.0, next_resync - time.monotonic()))
            if self._cancel.is_set():
                return
            if event is not None:
                self._reconcile((event.plugin.type, event.plugin.name))
            if time.monotonic() >= next_resync:
                self._resync()
                next_resync = time.monotonic() + self.resync_period

    def shutdown(self) -> None:
        """Stop everything, deterministically. Idempotent.

        With ``unmount_on_shutdown`` (off by default) the volumes this manager knows of are
        unmounted first, while the plugins still run (:meth:`unmount_all`; what fails is
        logged and left mounted). Then the run loop is stopped and joined (so no resync or
        event can start an instance afterwards), then every instance is shut down in
        parallel: each cancels its calls and retries, reports a final unhealthy
        fingerprint, and has exited its loop when this returns. By default volumes stay
        mounted.
        """
        if self.config.unmount_on_shutdown:
            with self._shutdown_lock:
                stopped = self._stopped
            if not stopped:
                for failure in self.unmount_all():
                    self._log.warning(
                        "left mounted at shutdown: %s of %s for %s: %s",
                        failure.key,
                        failure.plugin_id,
                        failure.alloc_id or "-",
                        failure.error,
                    )
        with self._shutdown_lock:
            if self._stopped:
                return
            self._stopped = True
            self._cancel.set()
            if self._subscription is not None:
                self._subscription.close()
            if self._thread is not None:
                self._thread.join()
        with self._lock:
            instances = list(self._instances.values())
            self._instances.clear()
            self._volume_managers.clear()
        threads = [
            threading.Thread(target=inst.shutdown, name=f"csi-shutdown-{inst.plugin.name}")
            for inst in instances
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        # Every plugin with the state it ended in: one that never answered reads
        # "undetected", not "detected" (a misleading log Nomad's driver manager once had).
        for inst in instances:
            final = inst.latest
            self._log.info(
                "CSI plugin %s (%s) at shutdown: %s",
                inst.plugin.name,
                inst.plugin.type.value,
                final.health.value if final is not None else HealthState.UNDETECTED.value,
            )

    # --- reconciling with the registry ----------------------------------------------

    def _resync(self) -> None:
        """Make the instances match the registry's newest instance of every plugin."""
        wanted: set[_Key] = set()
        for ptype in PluginType:
            for name in self.registry.list_plugins(ptype):
                wanted.add((ptype, name))
        with self._lock:
            wanted |= set(self._instances)
        for key in sorted(wanted):
            self._reconcile(key)

    def _reconcile(self, key: _Key) -> None:
        """Run an instance manager for the newest registered instance of ``key``, or none."""
        found = self.registry.instances(*key)
        if found:
            self._ensure_instance(found[0])
        else:
            self._ensure_no_instance(key)

    def _ensure_instance(self, plugin: RegisteredPlugin) -> None:
        key = (plugin.type, plugin.name)
        with self._lock:
            if self._cancel.is_set():
                return
            current = self._instances.get(key)
            if current is not None and current.plugin == plugin:
                current.trigger()
                return
        if current is not None:
            self._log.info(
                "plugin %s moved from %s to %s",
                plugin.name,
                current.plugin.alloc_id,
                plugin.alloc_id,
            )
            self._stop_instance(key, current)
        inst = InstanceManager(
            plugin,
            logger=self._log,
            update_info=self._update_info,
            trigger_node_event=self._trigger_node_event,
            fingerprint_interval=self.fingerprint_interval,
            rpc_timeout=self.rpc_timeout,
            client_factory=self._client_factory,
        )
        with self._lock:
            if self._cancel.is_set():
                return
            self._instances[key] = inst
            inst.start()

    def _ensure_no_instance(self, key: _Key) -> None:
        with self._lock:
            current = self._instances.get(key)
        if current is not None:
            self._stop_instance(key, current)

    def _stop_instance(self, key: _Key, inst: InstanceManager) -> None:
        with self._lock:
            if self._instances.get(key) is inst:
                del self._instances[key]
            self._volume_managers.pop(inst, None)
        inst.shutdown()

    # --- queries --------------------------------------------------------------------

    def instance(self, plugin_type: PluginType | str, name: str) -> InstanceManager | None:
        """The instance manager of a plugin, if one runs."""
        with self._lock:
            return self._instances.get((PluginType(plugin_type), name))

    def plugin_info(self, plugin_type: PluginType | str, name: str) -> CSIInfo | None:
        """The last fingerprint of a plugin's running instance (None if none)."""
        inst = self.instance(plugin_type, name)
        return None if inst is None else inst.latest

    def wait_for_plugin(
        self,
        name: str,
        timeout: float,
        *,
        plugin_type: PluginType | str = PluginType.CSI_NODE,
    ) -> RegisteredPlugin:
        """Wait until the plugin is registered (for a restarting agent); see
        :meth:`PluginRegistry.wait_for_plugin`. Gives up when the manager shuts down."""
        return self.registry.wait_for_plugin(
            name, timeout, plugin_type=plugin_type, cancel=self._cancel
        )

    def _wait_instance(self, plugin_id: str, deadline: float) -> InstanceManager:
        """The running instance of a registered node plugin, waiting for the run loop to
        start it."""
        while True:
            if self._cancel.is_set():
                raise ManagerShutdownError("the CSI manager was shut down")
            inst = self.instance(PluginType.CSI_NODE, plugin_id)
            if inst is not None:
                return inst
            if not self.registry.instances(PluginType.CSI_NODE, plugin_id):
                raise PluginNotFoundError(f"no csi-node plugin {plugin_id!r} is registered")
            if time.monotonic() >= deadline:
                raise PluginWaitTimeoutError(
                    f"csi-node plugin {plugin_id!r} is registered but its instance did not start"
                )
            self._cancel.wait(_INSTANCE_POLL)

    # --- volumes --------------------------------------------------------------------

    def volume_state(self, plugin_id: str) -> PluginVolumeState:
        """The usage claims and volume locks of a node plugin, created on first use:
        loaded from ``state_dir`` if set, then completed from the per-allocation mounts
        under the plugin's mount root."""
        validate_path_segment(plugin_id, "plugin name")
        with self._lock:
            state = self._volume_states.get(plugin_id)
            if state is not None:
                return state
            path = None
            if self.state_dir is not None:
                path = os.path.join(self.state_dir, "usage", f"{plugin_id}.json")
            tracker = UsageTracker(path)
            inst = self._instances.get((PluginType.CSI_NODE, plugin_id))
            if inst is not None:
                tracker.rebuild_from_mounts(inst.plugin.mount_root, self._mounter.is_mount_point)
            state = PluginVolumeState(tracker=tracker)
            self._volume_states[plugin_id] = state
            return state

    def mounter_for_plugin(
        self, plugin_id: str, *, timeout: float = DEFAULT_MOUNTER_WAIT
    ) -> VolumeManager:
        """The volume mounter of node plugin ``plugin_id``'s running instance.

        Waits up to ``timeout`` seconds in all for the instance of a registered plugin to
        start (the manager follows registry events on its own thread) and for its first
        good fingerprint (which says whether volumes are staged). Raises
        ``PluginNotFoundError`` when the plugin is not registered,
        :class:`~kubevol.nomad.errors.PluginWaitTimeoutError` when it did not start
        or answer in time, ``ManagerShutdownError`` after :meth:`shutdown`.
        """
        deadline = time.monotonic() + timeout
        inst = self._wait_instance(plugin_id, deadline)
        if not inst.wait_first_fingerprint(max(0.0, deadline - time.monotonic())):
            if inst.cancelled.is_set():
                raise ManagerShutdownError(f"csi-node plugin {plugin_id!r} was shut down")
            raise PluginWaitTimeoutError(
                f"csi-node plugin {plugin_id!r} was not fingerprinted within {timeout:g}s"
            )
        state = self.volume_state(plugin_id)
        with self._lock:
            found = self._volume_managers.get(inst)
            if found is not None:
                return found
            mounter = VolumeManager(
                inst.plugin,
                inst.volume_client(),
                requires_staging=inst.requires_staging,
                state=state,
                mounter=self._mounter,
                cancel=inst.cancelled,
                trigger_node_event=self._trigger_node_event,
                retry=self.retry,
                node_id=_node_id(inst),
                logger=self._log,
            )
            if self._instances.get((PluginType.CSI_NODE, plugin_id)) is inst:
                self._volume_managers[inst] = mounter
            return mounter

    def unmount_all(self, *, timeout: float | None = None) -> list[UnmountFailure]:
        """Unmount every volume the usage claims of running node plugins know of (each
        allocation's unpublish, then the unstage after the last), as Nomad's ``Shutdown``
        documents. Volumes this manager never mounted or rebuilt a claim for are not
        touched. Returns what could not be unmounted (left in place); raises nothing for
        a volume. ``timeout``: how long to wait for each plugin's mounter (default: the
        retry policy's timeout).
        """
        wait = self.retry.timeout if timeout is None else timeout
        with self._lock:
            names = sorted(name for ptype, name in self._instances if ptype is PluginType.CSI_NODE)
        failures: list[UnmountFailure] = []
        for name in names:
            try:
                mounter = self.mounter_for_plugin(name, timeout=wait)
            except Exception as exc:
                failures.append(
                    UnmountFailure(plugin_id=name, key=None, alloc_id="", error=str(exc))
                )
                continue
            tracker = mounter.state.tracker
            for key, allocs in sorted(tracker.claims().items()):
                for alloc_id in sorted(allocs):
                    try:
                        mounter.unmount_volume(
                            key.volume_id,
                            tracker.remote_id(key),
                            alloc_id,
                            UsageOptions.from_fs(key.usage),
                            namespace=key.namespace,
                        )
                    except Exception as exc:
                        failures.append(
                            UnmountFailure(
                                plugin_id=name, key=key, alloc_id=alloc_id, error=str(exc)
                            )
                        )
        return failures


def _node_id(inst: InstanceManager) -> str:
    info = inst.latest
    if info is None or info.node_info is None:
        return ""
    return info.node_info.node_id
