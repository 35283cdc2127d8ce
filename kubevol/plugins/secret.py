"""``kubernetes.io/secret``: a Secret's keys as files, in memory.

The files are projected by the atomic writer into a wrapped ``Memory`` emptyDir (tmpfs) at
``pods/<uid>/volumes/kubernetes.io~secret/<volume>``, so secret data never reaches the
node's disk; set-up runs again to bring updates. Secret values never appear in an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kubevol.k8s.objects import ObjectNotFoundError, Secret
from kubevol.plugins.atomic_volume import (
    AtomicVolume,
    AtomicVolumePlugin,
    key_payload,
    pod_namespace,
)
from kubevol.plugins.atomic_writer import FileProjection
from kubevol.plugins.empty_dir import MEDIUM_MEMORY
from kubevol.spec import ApiMapping, Spec
from kubevol.types import MounterArgs

if TYPE_CHECKING:
    from kubernetes.client import V1SecretVolumeSource

SECRET_PLUGIN_NAME = "kubernetes.io/secret"


def read_secret(
    host_func: Callable[[str, str], Secret], namespace: str, name: str, optional: bool
) -> Secret:
    """The Secret, or an empty one when it is missing and ``optional``."""
    try:
        found: Secret = host_func(namespace, name)
    except ObjectNotFoundError:
        if not optional:
            raise
        return Secret(namespace=namespace, name=name)
    return found


class SecretPlugin(AtomicVolumePlugin):
    """Secret volumes."""

    medium = MEDIUM_MEMORY

    def get_plugin_name(self) -> str:
        return SECRET_PLUGIN_NAME

    def source_of(self, spec: Spec) -> V1SecretVolumeSource | None:
        return spec.volume.secret

    def get_volume_name(self, spec: Spec) -> str:
        return str(self._check(spec).secret_name or "")

    def empty_source(self, volume_name: str) -> dict[str, ApiMapping]:
        # The kubelet knows no more after a restart: the volume name stands for the secret.
        return {"secret": {"secretName": volume_name}}

    def volume_class(self) -> type[AtomicVolume]:
        return SecretVolume


class SecretVolume(AtomicVolume):
    """One pod's secret volume."""

    def collect_payload(self, args: MounterArgs) -> dict[str, FileProjection]:
        source = self.source
        optional = bool(source.optional)
        secret = read_secret(
            self.host.get_secret_func(), pod_namespace(self.pod), str(source.secret_name or ""),
            optional,
        )
        return key_payload(
            kind="secret", items=source.items, values=secret.items(),
            default_mode=source.default_mode, optional=optional,
        )
