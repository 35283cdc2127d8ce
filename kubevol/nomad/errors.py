"""Errors of the CSI plugin manager, under :class:`~kubevol.errors.KubevolError`::

    KubevolError
    ├── PluginNotFoundError (LookupError)
    │   └── PluginWaitTimeoutError (TimeoutError)   a plugin was not registered in time
    ├── ManagerStateError                            a state file cannot be read or written
    ├── ManagerShutdownError                         the manager (or supervisor) was stopped
    └── PluginUnhealthyError                         a supervised plugin never became healthy

Failed CSI calls raise :class:`~kubevol.csi.errors.CSIRPCError` (or its uncertain variant)
and failed mount steps :class:`~kubevol.errors.MountError`, as they come.
"""

from __future__ import annotations

from kubevol.errors import KubevolError, PluginNotFoundError


class PluginWaitTimeoutError(PluginNotFoundError, TimeoutError):
    """``wait_for_plugin`` gave up: no instance of the plugin was registered in time."""


class ManagerStateError(KubevolError):
    """A registry or usage state file cannot be read or written; the message names it."""


class ManagerShutdownError(KubevolError):
    """The manager or supervisor was shut down; no new work is started after that."""


class PluginUnhealthyError(KubevolError):
    """A supervised plugin did not answer a healthy Probe within its health timeout."""
