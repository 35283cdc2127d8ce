"""CSI driver registration: the node's driver registry, the kubelet plugin-registration
watcher on ``<root>/plugins_registry``, and a registration socket server for drivers."""

from kubevol.plugins.csi.registration.registry import (
    CSIVersion,
    DriverNotRegisteredError,
    DriverRegistrationError,
    DriverRegistry,
    RegisteredDriver,
    highest_supported_version,
)
from kubevol.plugins.csi.registration.server import (
    CSI_PLUGIN_TYPE,
    RegistrationServer,
    RegistrationStatus,
    registration_socket_path,
    serve_registration,
)
from kubevol.plugins.csi.registration.watcher import (
    CSIPluginHandler,
    KnownPlugin,
    PluginHandler,
    PluginWatcher,
)

__all__ = [
    "CSI_PLUGIN_TYPE",
    "CSIPluginHandler",
    "CSIVersion",
    "DriverNotRegisteredError",
    "DriverRegistrationError",
    "DriverRegistry",
    "KnownPlugin",
    "PluginHandler",
    "PluginWatcher",
    "RegisteredDriver",
    "RegistrationServer",
    "RegistrationStatus",
    "highest_supported_version",
    "registration_socket_path",
    "serve_registration",
]
