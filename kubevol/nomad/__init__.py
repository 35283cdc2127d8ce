"""The CSI plugin manager for node agents that run CSI drivers as ordinary workloads
(Nomad's ``dynamicplugins`` registry and ``csimanager``).

- :class:`PluginRegistry`: plugins registered and deregistered at run time, with an ordered
  lossless event stream, ``wait_for_plugin`` and state persisted across agent restarts.
- :class:`CSIManager`: fingerprints every registered plugin (health, capabilities, node
  info) on a resync period and on registry events, with a deterministic shutdown.
- :class:`PluginSupervisor`: for the task that *is* a plugin: prepares its mount root, waits
  until it is healthy, registers it and heartbeats it.
- :class:`VolumeManager` (from :meth:`CSIManager.mounter_for_plugin`): stages and publishes
  volumes under ``<root>/staging/<ns>/<vol>/<usage>`` and
  ``<root>/per-alloc/<alloc>/<vol>/<usage>``, with a persisted :class:`UsageTracker` so a
  restarted agent never unstages a volume in use.
- :class:`VolumeChecker`: whether each mounted volume is healthy.
- :class:`AttachmentWaiter`: waits for a volume's publish context on this node (the
  controller publish done elsewhere) from an :class:`AttachmentSource`.
- The interfaces an agent codes against and fakes (:mod:`kubevol.testing.fake_nomad`):
  :class:`Manager`, :class:`PluginManager`, :class:`VolumeMounter`, :class:`NodeController`
  (with NodeExpandVolume); :class:`ManagerConfig` builds a manager with an injected logger.
- :class:`MountPropagation`: how a plugin task sees its directory; the supervisor makes the
  host side ``rshared`` so a node plugin's mounts reach the host.
"""

from kubevol.nomad.attachment import (
    AttachmentDirectory,
    AttachmentRecords,
    AttachmentSource,
    AttachmentWaiter,
)
from kubevol.nomad.checker import CheckMethod, VolumeChecker, VolumeHealth
from kubevol.nomad.claims import (
    ALLOC_DIR_NAME,
    STAGING_DIR_NAME,
    UsageTracker,
    VolumeKey,
)
from kubevol.nomad.csimanager import (
    DEFAULT_RESYNC_PERIOD,
    CSIManager,
    ManagerConfig,
    UnmountFailure,
)
from kubevol.nomad.errors import (
    AttachmentCancelledError,
    AttachmentTimeoutError,
    ExpansionNotSupportedError,
    ManagerShutdownError,
    ManagerStateError,
    MountPropagationError,
    PluginUnhealthyError,
    PluginWaitTimeoutError,
    VolumeNotPublishedError,
)
from kubevol.nomad.instance import (
    DEFAULT_FINGERPRINT_INTERVAL,
    Fingerprinter,
    InstanceManager,
)
from kubevol.nomad.interface import Manager, NodeController, PluginManager, VolumeMounter
from kubevol.nomad.propagation import MountPropagation
from kubevol.nomad.registry import (
    WAIT_BACKOFF,
    EventSubscription,
    PluginRegistry,
    PluginType,
    RegisteredPlugin,
    RegistryEvent,
    RegistryEventType,
)
from kubevol.nomad.supervisor import (
    PluginSupervisor,
    PluginTaskConfig,
    TaskEvent,
    TaskEventType,
    TaskMount,
)
from kubevol.nomad.types import (
    AccessMode,
    AttachmentMode,
    ControllerFingerprint,
    CSIInfo,
    CSIVolume,
    HealthState,
    MountInfo,
    MountOptions,
    NodeEvent,
    NodeFingerprint,
    TriggerNodeEvent,
    UpdateNodeCSIInfoFunc,
    UsageOptions,
)
from kubevol.nomad.volumes import (
    DEFAULT_MOUNT_ACTION_TIMEOUT,
    PluginVolumeState,
    RetryPolicy,
    VolumeManager,
)

__all__ = [
    "ALLOC_DIR_NAME",
    "DEFAULT_FINGERPRINT_INTERVAL",
    "DEFAULT_MOUNT_ACTION_TIMEOUT",
    "DEFAULT_RESYNC_PERIOD",
    "STAGING_DIR_NAME",
    "WAIT_BACKOFF",
    "AccessMode",
    "AttachmentCancelledError",
    "AttachmentDirectory",
    "AttachmentMode",
    "AttachmentRecords",
    "AttachmentSource",
    "AttachmentTimeoutError",
    "AttachmentWaiter",
    "CSIInfo",
    "CSIManager",
    "CSIVolume",
    "CheckMethod",
    "ControllerFingerprint",
    "EventSubscription",
    "ExpansionNotSupportedError",
    "Fingerprinter",
    "HealthState",
    "InstanceManager",
    "Manager",
    "ManagerConfig",
    "ManagerShutdownError",
    "ManagerStateError",
    "MountInfo",
    "MountOptions",
    "MountPropagation",
    "MountPropagationError",
    "NodeController",
    "NodeEvent",
    "NodeFingerprint",
    "PluginManager",
    "PluginRegistry",
    "PluginSupervisor",
    "PluginTaskConfig",
    "PluginType",
    "PluginUnhealthyError",
    "PluginVolumeState",
    "PluginWaitTimeoutError",
    "RegisteredPlugin",
    "RegistryEvent",
    "RegistryEventType",
    "RetryPolicy",
    "TaskEvent",
    "TaskEventType",
    "TaskMount",
    "TriggerNodeEvent",
    "UnmountFailure",
    "UpdateNodeCSIInfoFunc",
    "UsageOptions",
    "UsageTracker",
    "VolumeChecker",
    "VolumeHealth",
    "VolumeKey",
    "VolumeManager",
    "VolumeMounter",
    "VolumeNotPublishedError",
]
