"""``kubernetes.io/downward-api``: the pod's own fields and resources as files.

Each item's ``fieldRef`` or ``resourceFieldRef`` is rendered by :mod:`kubevol.k8s.fieldpath`
(labels and annotations as sorted ``key="value"`` lines) and projected by the atomic
writer into a wrapped ``Memory`` emptyDir, as the kubelet does, at
``pods/<uid>/volumes/kubernetes.io~downward-api/<volume>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kubevol.host import VolumeHost
from kubevol.k8s.fieldpath import extract_field_path, extract_resource_value
from kubevol.k8s.pod import Pod
from kubevol.plugins.atomic_volume import AtomicVolume, AtomicVolumePlugin, mode_of, raise_all
from kubevol.plugins.atomic_writer import FileProjection
from kubevol.plugins.empty_dir import MEDIUM_MEMORY
from kubevol.spec import ApiMapping, Spec
from kubevol.types import MounterArgs

if TYPE_CHECKING:
    from kubernetes.client import V1DownwardAPIVolumeFile, V1DownwardAPIVolumeSource

DOWNWARD_API_PLUGIN_NAME = "kubernetes.io/downward-api"


def collect_downward_api(
    items: Sequence[V1DownwardAPIVolumeFile] | None,
    pod: Pod,
    host: VolumeHost,
    default_mode: int | None,
) -> dict[str, FileProjection]:
    """The kubelet's ``CollectData``: one file per item; every failing item is reported
    (together) and nothing is returned then."""
    payload: dict[str, FileProjection] = {}
    errors: list[BaseException] = []
    for item in items or []:
        data = b""
        try:
            if item.field_ref is not None:
                data = extract_field_path(
                    pod, str(item.field_ref.field_path or ""),
                    node_name=host.get_node_name(), host_ip=_host_ip(host),
                ).encode("utf-8")
            elif item.resource_field_ref is not None:
                ref = item.resource_field_ref
                data = extract_resource_value(
                    ref, pod, str(ref.container_name or ""), host.get_node_allocatable()
                ).encode("utf-8")
        except (ValueError, LookupError) as exc:
            errors.append(exc)
        payload[item.path] = FileProjection(data=data, mode=mode_of(item.mode, default_mode))
    raise_all(errors)
    return payload


def _host_ip(host: VolumeHost) -> str:
    try:
        return host.get_host_ip()
    except OSError:
        return ""


class DownwardAPIPlugin(AtomicVolumePlugin):
    """downwardAPI volumes."""

    medium = MEDIUM_MEMORY

    def get_plugin_name(self) -> str:
        return DOWNWARD_API_PLUGIN_NAME

    def source_of(self, spec: Spec) -> V1DownwardAPIVolumeSource | None:
        return spec.volume.downward_api

    def get_volume_name(self, spec: Spec) -> str:
        self._check(spec)
        return spec.name()

    def empty_source(self, volume_name: str) -> dict[str, ApiMapping]:
        return {"downwardAPI": {}}

    def volume_class(self) -> type[AtomicVolume]:
        return DownwardAPIVolume


class DownwardAPIVolume(AtomicVolume):
    """One pod's downwardAPI volume."""

    def collect_payload(self, args: MounterArgs) -> dict[str, FileProjection]:
        return collect_downward_api(
            self.source.items, self.mounter_pod(), self.host, self.source.default_mode
        )
