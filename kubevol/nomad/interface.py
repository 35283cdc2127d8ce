"""The interfaces of the CSI plugin manager (Nomad's ``csimanager/interface.go`` and
``pluginmanager.PluginManager``), as abstract bases an agent codes against and can fake.

::

    PluginManager        run / shutdown / plugin_type / wait_for_first_fingerprint
    VolumeMounter        mount_volume / unmount_volume / has_mount
    └── NodeController   + expand_volume, node_id, requires_staging (Nomad's VolumeManager)
    Manager              plugin_manager / mounter_for_plugin / wait_for_plugin / shutdown

:class:`~kubevol.nomad.CSIManager` is a :class:`Manager` and its own :class:`PluginManager`;
:class:`~kubevol.nomad.VolumeManager` is a :class:`NodeController`.
:mod:`kubevol.testing.fake_nomad` ships a fake of both for an agent's unit tests.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping

from kubevol.csi import types as t
from kubevol.nomad.claims import DEFAULT_NAMESPACE
from kubevol.nomad.registry import PluginType, RegisteredPlugin
from kubevol.nomad.types import CSIVolume, MountInfo, UsageOptions

#: What :attr:`PluginManager.plugin_type` answers for the CSI manager (Nomad's ``"csi"``).
CSI_PLUGIN_MANAGER_TYPE = "csi"


class PluginManager(abc.ABC):
    """What the node fingerprinter drives (Nomad's ``pluginmanager.PluginManager`` with
    ``WaitForFirstFingerprint``)."""

    @property
    @abc.abstractmethod
    def plugin_type(self) -> str:
        """The kind of plugins managed (``"csi"`` for the CSI manager)."""

    @abc.abstractmethod
    def run(self) -> None:
        """Start managing; returns once started. Idempotent."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop managing; returns once everything stopped. Idempotent."""

    @abc.abstractmethod
    def wait_for_first_fingerprint(self, timeout: float | None) -> bool:
        """Wait until every plugin known when this is called was fingerprinted once,
        healthy or not; True when that happened within ``timeout`` seconds."""


class VolumeMounter(abc.ABC):
    """Mounts volumes of one node plugin for allocations (Nomad's ``VolumeMounter``)."""

    @abc.abstractmethod
    def mount_volume(
        self,
        volume: CSIVolume,
        alloc_id: str,
        usage_options: UsageOptions,
        publish_context: Mapping[str, str] | None = None,
    ) -> MountInfo:
        """Stage (if the plugin stages) and publish ``volume`` for ``alloc_id``; where it
        is on the host. Idempotent."""

    @abc.abstractmethod
    def unmount_volume(
        self,
        volume_id: str,
        remote_id: str,
        alloc_id: str,
        usage_options: UsageOptions,
        *,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        """Unpublish ``volume_id`` for ``alloc_id``; unstage it when no allocation uses it
        any more. Idempotent."""

    @abc.abstractmethod
    def has_mount(self, info: MountInfo) -> bool:
        """Whether ``info.source`` is (still) a healthy mount."""


class NodeController(VolumeMounter):
    """The node-local part of CSI for one plugin: staging, publishing and expansion
    (Nomad's ``VolumeManager``)."""

    @property
    @abc.abstractmethod
    def node_id(self) -> str:
        """The plugin's id of this node (NodeGetInfo; Nomad's ``ExternalID``)."""

    @property
    @abc.abstractmethod
    def requires_staging(self) -> bool:
        """Whether volumes are staged before they are published."""

    @abc.abstractmethod
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
        """NodeExpandVolume on ``alloc_id``'s published volume (after the controller grew
        it); returns the new capacity in bytes (0: the plugin did not say)."""


class Manager(abc.ABC):
    """The CSI plugin manager an agent holds (Nomad's ``csimanager.Manager``)."""

    @abc.abstractmethod
    def plugin_manager(self) -> PluginManager:
        """The :class:`PluginManager` for the node fingerprinter."""

    @abc.abstractmethod
    def mounter_for_plugin(self, plugin_id: str, *, timeout: float = 60.0) -> NodeController:
        """The volume manager of node plugin ``plugin_id``; raises
        :class:`~kubevol.errors.PluginNotFoundError` when it is not registered."""

    @abc.abstractmethod
    def wait_for_plugin(
        self,
        name: str,
        timeout: float,
        *,
        plugin_type: PluginType | str = PluginType.CSI_NODE,
    ) -> RegisteredPlugin:
        """Wait until plugin ``name`` is registered; raises
        :class:`~kubevol.nomad.errors.PluginWaitTimeoutError` otherwise."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the manager. Whether volumes are unmounted is the implementation's
        documented choice (:class:`~kubevol.nomad.CSIManager` keeps them by default)."""
