"""In-memory fakes of :mod:`kubevol.nomad`'s interfaces, for unit tests of an agent built
on the CSI plugin manager: :class:`FakeCSIManager` (a :class:`~kubevol.nomad.Manager` and
its own :class:`~kubevol.nomad.PluginManager`) hands out :class:`FakeNodeController` s
(:class:`~kubevol.nomad.NodeController`), which record every call, keep what is
"mounted" in memory, and raise injected errors. Nothing touches the disk.

::

    manager = FakeCSIManager()
    controller = manager.add_plugin("hostpath")
    controller.fail_next("mount_volume", CSIRPCError(...))
    agent = MyAgent(manager)        # codes against kubevol.nomad.Manager
    ...
    assert [c.method for c in controller.calls] == ["mount_volume", "mount_volume"]
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping

import attrs

from kubevol.csi import types as t
from kubevol.errors import PluginNotFoundError
from kubevol.layout import validate_path_segment
from kubevol.nomad import (
    ALLOC_DIR_NAME,
    CSIVolume,
    ExpansionNotSupportedError,
    Manager,
    ManagerShutdownError,
    MountInfo,
    NodeController,
    PluginManager,
    PluginType,
    PluginWaitTimeoutError,
    RegisteredPlugin,
    UsageOptions,
    VolumeNotPublishedError,
)
from kubevol.nomad.claims import DEFAULT_NAMESPACE
from kubevol.nomad.interface import CSI_PLUGIN_MANAGER_TYPE


@attrs.frozen(kw_only=True)
class FakeNomadCall:
    """One recorded call of a :class:`FakeNodeController`."""

    method: str
    volume_id: str
    alloc_id: str
    usage: str
    namespace: str = DEFAULT_NAMESPACE
    publish_context: Mapping[str, str] = attrs.field(factory=dict)
    capacity: t.CapacityRange | None = None


class FakeNodeController(NodeController):
    """A node plugin's volume manager in memory. Thread-safe.

    Mounts are recorded per (namespace, volume, usage, allocation) with the real layout's
    host path under ``root`` (``<root>/per-alloc/<alloc>/<volume>/<usage>``); names are
    validated as the real one does. :meth:`fail_next` makes the next call of a method
    raise. ``expandable=False`` makes :meth:`expand_volume` raise
    :class:`~kubevol.nomad.ExpansionNotSupportedError`.
    """

    def __init__(
        self,
        plugin_id: str = "fake",
        *,
        root: str = "/fake/csi",
        node_id: str = "fake-node",
        requires_staging: bool = True,
        expandable: bool = True,
    ) -> None:
        self.plugin_id = validate_path_segment(plugin_id, "plugin name")
        self.root = root
        self.expandable = expandable
        self._node_id = node_id
        self._requires_staging = requires_staging
        self._lock = threading.Lock()
        self.calls: list[FakeNomadCall] = []
        self.mounts: dict[tuple[str, str, str, str], MountInfo] = {}
        self.capacities: dict[tuple[str, str], int] = {}
        self._errors: dict[str, list[BaseException]] = {}

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def requires_staging(self) -> bool:
        return self._requires_staging

    def fail_next(self, method: str, error: BaseException) -> None:
        """Make the next call of ``method`` (``"mount_volume"``, ...) raise ``error``."""
        with self._lock:
            self._errors.setdefault(method, []).append(error)

    def _record(self, call: FakeNomadCall) -> None:
        with self._lock:
            self.calls.append(call)
            pending = self._errors.get(call.method)
            error = pending.pop(0) if pending else None
        if error is not None:
            raise error

    def mount_volume(
        self,
        volume: CSIVolume,
        alloc_id: str,
        usage_options: UsageOptions,
        publish_context: Mapping[str, str] | None = None,
    ) -> MountInfo:
        validate_path_segment(alloc_id, "allocation id")
        usage = usage_options.to_fs()
        self._record(
            FakeNomadCall(
                method="mount_volume",
                volume_id=volume.id,
                alloc_id=alloc_id,
                usage=usage,
                namespace=volume.namespace,
                publish_context=dict(publish_context or {}),
            )
        )
        info = MountInfo(
            source=os.path.join(self.root, ALLOC_DIR_NAME, alloc_id, volume.id, usage),
            is_device=usage_options.attachment_mode.value == "block-device",
        )
        with self._lock:
            self.mounts[(volume.namespace, volume.id, usage, alloc_id)] = info
        return info

    def unmount_volume(
        self,
        volume_id: str,
        remote_id: str,
        alloc_id: str,
        usage_options: UsageOptions,
        *,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        validate_path_segment(volume_id, "volume id")
        validate_path_segment(alloc_id, "allocation id")
        usage = usage_options.to_fs()
        self._record(
            FakeNomadCall(
                method="unmount_volume",
                volume_id=volume_id,
                alloc_id=alloc_id,
                usage=usage,
                namespace=namespace,
            )
        )
        with self._lock:
            self.mounts.pop((namespace, volume_id, usage, alloc_id), None)

    def has_mount(self, info: MountInfo) -> bool:
        with self._lock:
            return info in self.mounts.values()

    def expand_volume(
        self,
        volume_id: str,
        remote_id: str,
        alloc_id: str,
        usage_options: UsageOptions,
        capacity: t.CapacityRange,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        secrets: Mapping[str, str] | None = None,
    ) -> int:
        usage = usage_options.to_fs()
        self._record(
            FakeNomadCall(
                method="expand_volume",
                volume_id=volume_id,
                alloc_id=alloc_id,
                usage=usage,
                namespace=namespace,
                capacity=capacity,
            )
        )
        if not self.expandable:
            raise ExpansionNotSupportedError(f"fake plugin {self.plugin_id!r} does not expand")
        with self._lock:
            if (namespace, volume_id, usage, alloc_id) not in self.mounts:
                raise VolumeNotPublishedError(
                    f"volume {volume_id!r} is not mounted for allocation {alloc_id!r}"
                )
            size = max(capacity.required_bytes, self.capacities.get((namespace, volume_id), 0))
            self.capacities[(namespace, volume_id)] = size
        return size


class FakeCSIManager(Manager, PluginManager):
    """A CSI manager in memory: node plugins are named at construction or added with
    :meth:`add_plugin`. Thread-safe.

    ``unmount_on_shutdown`` makes :meth:`shutdown` unmount every recorded mount, as
    :class:`~kubevol.nomad.CSIManager` does with the same option.
    """

    def __init__(self, plugins: Iterable[str] = (), *, unmount_on_shutdown: bool = False) -> None:
        self.unmount_on_shutdown = unmount_on_shutdown
        self.controllers: dict[str, FakeNodeController] = {}
        self._plugins: dict[str, RegisteredPlugin] = {}
        self._lock = threading.Lock()
        self.running = False
        self.stopped = False
        for plugin_id in plugins:
            self.add_plugin(plugin_id)

    def add_plugin(
        self, plugin_id: str, controller: FakeNodeController | None = None
    ) -> FakeNodeController:
        """Register a node plugin; its controller (a new one unless given)."""
        found = controller if controller is not None else FakeNodeController(plugin_id)
        plugin = RegisteredPlugin(
            type=PluginType.CSI_NODE,
            name=plugin_id,
            alloc_id="fake-plugin-alloc",
            socket_path=os.path.join(found.root, "csi.sock"),
            mount_root=found.root,
        )
        with self._lock:
            self.controllers[plugin_id] = found
            self._plugins[plugin_id] = plugin
        return found

    # --- PluginManager ---------------------------------------------------------------

    @property
    def plugin_type(self) -> str:
        return CSI_PLUGIN_MANAGER_TYPE

    def run(self) -> None:
        self.running = True

    def wait_for_first_fingerprint(self, timeout: float | None) -> bool:
        return self.running

    # --- Manager ---------------------------------------------------------------------

    def plugin_manager(self) -> PluginManager:
        return self

    def mounter_for_plugin(self, plugin_id: str, *, timeout: float = 60.0) -> FakeNodeController:
        if self.stopped:
            raise ManagerShutdownError("the fake CSI manager was shut down")
        with self._lock:
            found = self.controllers.get(plugin_id)
        if found is None:
            raise PluginNotFoundError(f"no csi-node plugin {plugin_id!r} is registered")
        return found

    def wait_for_plugin(
        self,
        name: str,
        timeout: float,
        *,
        plugin_type: PluginType | str = PluginType.CSI_NODE,
    ) -> RegisteredPlugin:
        with self._lock:
            found = self._plugins.get(name)
        if found is None or found.type is not PluginType(plugin_type):
            raise PluginWaitTimeoutError(
                f"{PluginType(plugin_type).value} plugin {name!r} is not registered"
            )
        return found

    def shutdown(self) -> None:
        if self.stopped:
            return
        if self.unmount_on_shutdown:
            for controller in list(self.controllers.values()):
                for namespace, volume_id, usage, alloc_id in sorted(controller.mounts):
                    controller.unmount_volume(
                        volume_id, "", alloc_id, UsageOptions.from_fs(usage), namespace=namespace
                    )
        self.stopped = True
        self.running = False
