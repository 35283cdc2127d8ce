"""In-tree volume plugins, written on kubevol's public bases as any plugin author would."""

from __future__ import annotations

from kubevol.plugin import VolumePlugin
from kubevol.plugins.empty_dir import EMPTY_DIR_PLUGIN_NAME, EmptyDirPlugin
from kubevol.plugins.host_path import HOST_PATH_PLUGIN_NAME, HostPathPlugin

__all__ = [
    "EMPTY_DIR_PLUGIN_NAME",
    "HOST_PATH_PLUGIN_NAME",
    "EmptyDirPlugin",
    "HostPathPlugin",
    "builtin_plugins",
]


def builtin_plugins() -> list[VolumePlugin]:
    """Fresh instances of every plugin shipped with kubevol, the CSI adapter included.

    The CSI adapter is imported here, lazily, because it brings grpc with it.
    """
    from kubevol.csi.plugin import CSIPlugin

    return [EmptyDirPlugin(), HostPathPlugin(), CSIPlugin()]
