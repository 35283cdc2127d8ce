"""``kubernetes.io/configmap``: a ConfigMap's keys as files, on the node's disk.

The files are projected by the atomic writer into a wrapped disk emptyDir at
``pods/<uid>/volumes/kubernetes.io~configmap/<volume>``; set-up runs again to bring updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kubevol.k8s.objects import ConfigMap, ObjectNotFoundError
from kubevol.plugins.atomic_volume import (
    AtomicVolume,
    AtomicVolumePlugin,
    key_payload,
    pod_namespace,
)
from kubevol.plugins.atomic_writer import FileProjection
from kubevol.plugins.empty_dir import MEDIUM_DEFAULT
from kubevol.spec import ApiMapping, Spec
from kubevol.types import MounterArgs

if TYPE_CHECKING:
    from kubernetes.client import V1ConfigMapVolumeSource

CONFIG_MAP_PLUGIN_NAME = "kubernetes.io/configmap"


def read_config_map(
    host_func: Callable[[str, str], ConfigMap], namespace: str, name: str, optional: bool
) -> ConfigMap:
    """The ConfigMap, or an empty one when it is missing and ``optional``."""
    try:
        found: ConfigMap = host_func(namespace, name)
    except ObjectNotFoundError:
        if not optional:
            raise
        return ConfigMap(namespace=namespace, name=name)
    return found


class ConfigMapPlugin(AtomicVolumePlugin):
    """ConfigMap volumes."""

    medium = MEDIUM_DEFAULT

    def get_plugin_name(self) -> str:
        return CONFIG_MAP_PLUGIN_NAME

    def source_of(self, spec: Spec) -> V1ConfigMapVolumeSource | None:
        return spec.volume.config_map

    def get_volume_name(self, spec: Spec) -> str:
        return f"{spec.name()}/{self._check(spec).name}"

    def empty_source(self, volume_name: str) -> dict[str, ApiMapping]:
        return {"configMap": {}}

    def volume_class(self) -> type[AtomicVolume]:
        return ConfigMapVolume


class ConfigMapVolume(AtomicVolume):
    """One pod's configMap volume."""

    def collect_payload(self, args: MounterArgs) -> dict[str, FileProjection]:
        source = self.source
        optional = bool(source.optional)
        config_map = read_config_map(
            self.host.get_config_map_func(), pod_namespace(self.pod), str(source.name or ""),
            optional,
        )
        return key_payload(
            kind="configmap", items=source.items, values=config_map.items(),
            default_mode=source.default_mode, optional=optional,
        )
