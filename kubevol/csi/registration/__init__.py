"""CSI driver registration: the node's driver registry, the kubelet plugin-registration
watcher on ``<root>/plugins_registry``, and a registration socket server for drivers."""

from kubevol.csi.registration.registry import (
    CSIVersion,
    DriverNotRegisteredError,
    DriverRegistrationError,
    DriverRegistry,
    RegisteredDriver,
    highest_supported_version,
)

__all__ = [
    "CSIVersion",
    "DriverNotRegisteredError",
    "DriverRegistrationError",
    "DriverRegistry",
    "RegisteredDriver",
    "highest_supported_version",
]
