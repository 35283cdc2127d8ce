"""CSI for kubevol: the wire protocol, a client for any CSI driver, and a driver framework.

- :class:`CSIClient` calls any CSI driver with :mod:`kubevol.csi.types` in and out;
- :mod:`kubevol.csi.errors` holds the CSI error branch (:class:`CSIRPCError`, ...);
- :mod:`kubevol.csi.server` serves drivers written in Python (gocsi's role);
- :mod:`kubevol.csi.locks` holds the serial-volume lock providers;
- :class:`CSIPlugin` is the kubelet's ``kubernetes.io/csi`` volume plugin, with driver
  registration (:class:`DriverRegistry`, :class:`PluginWatcher`), CSIDriver information
  (:class:`LocalCSIDrivers`, :class:`KubernetesCSIDrivers`) and attachment backends.

Names are imported on first use, so ``import kubevol.csi`` does not load grpc.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# gRPC's fork handlers (pthread_atfork) wait for gRPC's threads to reach a safe point before
# every fork; kubevol forks only to exec (mount(8), helpers, drivers), where they protect
# nothing, and under load they deadlocked a subprocess.run() inside fork() for good (seen in
# the test suite, grpcio 1.85: main thread in fork -> cygrpc prefork -> futex). gRPC's
# documented setting for fork+exec programs turns them off; a program that sets it keeps its
# choice. Set before any gRPC import: gRPC reads it once.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

if TYPE_CHECKING:
    from kubevol.csi.attach import DirectAttachBackend, VolumeAttachmentBackend
    from kubevol.csi.client import DEFAULT_TIMEOUT, CSIClient
    from kubevol.csi.driverinfo import CSIDriverInfo, KubernetesCSIDrivers, LocalCSIDrivers
    from kubevol.csi.errors import (
        CSIEndpointError,
        CSIRPCError,
        CSIRPCUncertainError,
        CSIServeError,
    )
    from kubevol.csi.plugin import CSIPlugin, VolumeDataError
    from kubevol.csi.registration import (
        DriverNotRegisteredError,
        DriverRegistry,
        PluginWatcher,
        RegistrationServer,
        serve_registration,
    )

_LAZY = {
    "CSIClient": "kubevol.csi.client",
    "DEFAULT_TIMEOUT": "kubevol.csi.client",
    "CSIEndpointError": "kubevol.csi.errors",
    "CSIRPCError": "kubevol.csi.errors",
    "CSIRPCUncertainError": "kubevol.csi.errors",
    "CSIServeError": "kubevol.csi.errors",
    "CSIPlugin": "kubevol.csi.plugin",
    "VolumeDataError": "kubevol.csi.plugin",
    "DriverRegistry": "kubevol.csi.registration",
    "PluginWatcher": "kubevol.csi.registration",
    "RegistrationServer": "kubevol.csi.registration",
    "serve_registration": "kubevol.csi.registration",
    "DriverNotRegisteredError": "kubevol.csi.registration",
    "CSIDriverInfo": "kubevol.csi.driverinfo",
    "LocalCSIDrivers": "kubevol.csi.driverinfo",
    "KubernetesCSIDrivers": "kubevol.csi.driverinfo",
    "DirectAttachBackend": "kubevol.csi.attach",
    "VolumeAttachmentBackend": "kubevol.csi.attach",
}

__all__ = [
    "DEFAULT_TIMEOUT",
    "CSIClient",
    "CSIDriverInfo",
    "CSIEndpointError",
    "CSIPlugin",
    "CSIRPCError",
    "CSIRPCUncertainError",
    "CSIServeError",
    "DirectAttachBackend",
    "DriverNotRegisteredError",
    "DriverRegistry",
    "KubernetesCSIDrivers",
    "LocalCSIDrivers",
    "PluginWatcher",
    "RegistrationServer",
    "VolumeAttachmentBackend",
    "VolumeDataError",
    "serve_registration",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kubevol.csi' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
