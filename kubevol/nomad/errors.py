"""Errors of the CSI plugin manager, under :class:`~kubevol.errors.KubevolError`::

    KubevolError
    ├── PluginNotFoundError (LookupError)
    │   └── PluginWaitTimeoutError (TimeoutError)   a plugin was not registered in time
    ├── ManagerStateError                            a state file cannot be read or written
    ├── ManagerShutdownError                         the manager (or supervisor) was stopped
    ├── PluginUnhealthyError                         a supervised plugin never became healthy
    ├── AttachmentTimeoutError (TimeoutError)        a volume was not attached to the node in time
    ├── AttachmentCancelledError                     waiting for an attachment was cancelled
    ├── ExpansionNotSupportedError                   the node plugin does not offer EXPAND_VOLUME
    ├── VolumeNotPublishedError (LookupError)        no mount of the volume for that allocation
    └── MountPropagationError (MountError)           a plugin's directory cannot be made rshared

Failed CSI calls raise :class:`~kubevol.csi.errors.CSIRPCError` (or its uncertain variant)
and failed mount steps :class:`~kubevol.errors.MountError`, as they come.
"""

from __future__ import annotations

from kubevol.errors import KubevolError, MountError, PluginNotFoundError


class PluginWaitTimeoutError(PluginNotFoundError, TimeoutError):
    """``wait_for_plugin`` gave up: no instance of the plugin was registered in time."""


class ManagerStateError(KubevolError):
    """A registry or usage state file cannot be read or written; the message names it."""


class ManagerShutdownError(KubevolError):
    """The manager or supervisor was shut down; no new work is started after that."""


class PluginUnhealthyError(KubevolError):
    """A supervised plugin did not answer a healthy Probe within its health timeout."""


class AttachmentTimeoutError(KubevolError, TimeoutError):
    """:class:`~kubevol.nomad.AttachmentWaiter` gave up: no publish context of the volume
    for the node appeared in time."""


class AttachmentCancelledError(KubevolError):
    """Waiting for an attachment was cancelled (the manager shut down, or the caller's
    cancel event was set)."""


class ExpansionNotSupportedError(KubevolError):
    """NodeExpandVolume was asked of a plugin that does not advertise EXPAND_VOLUME."""


class VolumeNotPublishedError(KubevolError, LookupError):
    """An operation on an allocation's volume (expansion) found it not mounted there."""


class MountPropagationError(MountError):
    """A plugin's mount root could not be made a shared (rshared) mount; names it."""
