"""In-tree volume plugins, written on kubevol's public bases as any plugin author would."""

from __future__ import annotations

from kubevol.plugin import VolumePlugin
from kubevol.plugins.config_map import CONFIG_MAP_PLUGIN_NAME, ConfigMapPlugin
from kubevol.plugins.downward_api import DOWNWARD_API_PLUGIN_NAME, DownwardAPIPlugin
from kubevol.plugins.empty_dir import EMPTY_DIR_PLUGIN_NAME, EmptyDirPlugin
from kubevol.plugins.host_path import HOST_PATH_PLUGIN_NAME, HostPathPlugin
from kubevol.plugins.local import LOCAL_VOLUME_PLUGIN_NAME, LocalVolumePlugin
from kubevol.plugins.projected import PROJECTED_PLUGIN_NAME, ProjectedPlugin
from kubevol.plugins.secret import SECRET_PLUGIN_NAME, SecretPlugin

__all__ = [
    "CONFIG_MAP_PLUGIN_NAME",
    "DOWNWARD_API_PLUGIN_NAME",
    "EMPTY_DIR_PLUGIN_NAME",
    "HOST_PATH_PLUGIN_NAME",
    "LOCAL_VOLUME_PLUGIN_NAME",
    "PROJECTED_PLUGIN_NAME",
    "SECRET_PLUGIN_NAME",
    "ConfigMapPlugin",
    "DownwardAPIPlugin",
    "EmptyDirPlugin",
    "HostPathPlugin",
    "LocalVolumePlugin",
    "ProjectedPlugin",
    "SecretPlugin",
    "builtin_plugins",
]


def builtin_plugins() -> list[VolumePlugin]:
    """Fresh instances of every in-tree plugin shipped with kubevol. The CSI adapter is not
    one of them: the node layer adds it (:func:`kubevol.node.host.node_plugins`)."""
    return [
        EmptyDirPlugin(),
        HostPathPlugin(),
        ConfigMapPlugin(),
        SecretPlugin(),
        DownwardAPIPlugin(),
        ProjectedPlugin(),
        LocalVolumePlugin(),
    ]
