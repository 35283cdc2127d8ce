"""``kubernetes.io/projected``: several sources in one directory, in memory.

Sources: ``configMap`` and ``secret`` keys, ``downwardAPI`` items and a
``serviceAccountToken`` of the pod's service account (every pod's ``kube-api-access-*``
volume is one of these). All are collected first (every failing source reported
together), then projected by the atomic writer into a wrapped ``Memory`` emptyDir at
``pods/<uid>/volumes/kubernetes.io~projected/<volume>``. With an fsGroup or fsUser the
token file is written ``0600`` and the fsGroup rules make it ``0640``, as the kubelet does.
``clusterTrustBundle`` sources are refused with a clear error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubevol.errors import KubevolError, SpecError
from kubevol.k8s.tokens import DEFAULT_EXPIRATION_SECONDS, TokenProviderMissingError, TokenRequest
from kubevol.plugins.atomic_volume import (
    AtomicVolume,
    AtomicVolumePlugin,
    describe_pod,
    key_payload,
    mode_of,
    pod_namespace,
    raise_all,
)
from kubevol.plugins.atomic_writer import FileProjection
from kubevol.plugins.config_map import read_config_map
from kubevol.plugins.downward_api import collect_downward_api
from kubevol.plugins.empty_dir import MEDIUM_MEMORY
from kubevol.plugins.secret import read_secret
from kubevol.spec import ApiMapping, Spec
from kubevol.types import MounterArgs

if TYPE_CHECKING:
    from kubernetes.client import (
        V1ProjectedVolumeSource,
        V1ServiceAccountTokenProjection,
        V1VolumeProjection,
    )

PROJECTED_PLUGIN_NAME = "kubernetes.io/projected"
#: Mode of a token file when the pod has an fsGroup or fsUser (then made 0640 by fsGroup).
TOKEN_MODE_WITH_FS_GROUP = 0o600


def projects_a_token(spec: Spec) -> bool:
    """Whether ``spec`` is a projected volume with a service-account token among its
    sources (what must be set up again before the token expires)."""
    source = spec.volume.projected if spec.volume is not None else None
    return source is not None and any(
        s.service_account_token is not None for s in source.sources or ()
    )


class ProjectedPlugin(AtomicVolumePlugin):
    """Projected volumes."""

    medium = MEDIUM_MEMORY

    def get_plugin_name(self) -> str:
        return PROJECTED_PLUGIN_NAME

    def source_of(self, spec: Spec) -> V1ProjectedVolumeSource | None:
        return spec.volume.projected

    def get_volume_name(self, spec: Spec) -> str:
        self._check(spec)
        return spec.name()

    def empty_source(self, volume_name: str) -> dict[str, ApiMapping]:
        return {"projected": {"sources": []}}

    def volume_class(self) -> type[AtomicVolume]:
        return ProjectedVolume


class ProjectedVolume(AtomicVolume):
    """One pod's projected volume."""

    def collect_payload(self, args: MounterArgs) -> dict[str, FileProjection]:
        default_mode = self.source.default_mode
        namespace = pod_namespace(self.pod)
        payload: dict[str, FileProjection] = {}
        errors: list[BaseException] = []
        for source in self.source.sources or []:
            try:
                payload.update(self._one(source, namespace, default_mode, args))
            except (KubevolError, ValueError, LookupError) as exc:
                errors.append(exc)
        raise_all(errors)
        return payload

    def _one(
        self,
        source: V1VolumeProjection,
        namespace: str,
        default_mode: int | None,
        args: MounterArgs,
    ) -> dict[str, FileProjection]:
        if source.secret is not None:
            optional = bool(source.secret.optional)
            secret = read_secret(self.host.get_secret_func(), namespace,
                                 str(source.secret.name or ""), optional)
            return key_payload(kind="secret", items=source.secret.items, values=secret.items(),
                               default_mode=default_mode, optional=optional)
        if source.config_map is not None:
            optional = bool(source.config_map.optional)
            config_map = read_config_map(self.host.get_config_map_func(), namespace,
                                         str(source.config_map.name or ""), optional)
            return key_payload(kind="configmap", items=source.config_map.items,
                               values=config_map.items(), default_mode=default_mode,
                               optional=optional)
        if source.downward_api is not None:
            return collect_downward_api(source.downward_api.items, self.mounter_pod(), self.host,
                                        default_mode)
        if source.service_account_token is not None:
            return self._token(source.service_account_token, namespace, default_mode, args)
        if getattr(source, "cluster_trust_bundle", None) is not None:
            raise SpecError(f"volume {self.volume_name!r}: clusterTrustBundle sources are not "
                            "supported by kubevol")
        raise SpecError(f"volume {self.volume_name!r}: a projected source names no kind")

    def _token(
        self,
        projection: V1ServiceAccountTokenProjection,
        namespace: str,
        default_mode: int | None,
        args: MounterArgs,
    ) -> dict[str, FileProjection]:
        mode = mode_of(None, default_mode)
        if args.fs_user is not None or args.fs_group is not None:
            mode = TOKEN_MODE_WITH_FS_GROUP
        pod = self.mounter_pod()
        meta = pod.metadata
        spec = getattr(pod, "spec", None)
        request = TokenRequest(
            namespace=namespace,
            service_account=str(getattr(spec, "service_account_name", None) or "default"),
            audiences=(str(projection.audience),) if projection.audience else (),
            expiration_seconds=int(projection.expiration_seconds or DEFAULT_EXPIRATION_SECONDS),
            pod_name=str(getattr(meta, "name", None) or ""),
            pod_uid=self.pod_uid,
        )
        try:
            issued = self.host.get_service_account_token_func()(request)
        except TokenProviderMissingError:
            raise TokenProviderMissingError(
                f"pod {describe_pod(self.pod)} volume {self.volume_name!r} needs a "
                f"service-account token ({request.describe()}, file {projection.path!r}) but "
                "no token provider is configured: configure an API server (--kubeconfig) or "
                "a token provider (--token-provider)"
            ) from None
        return {
            projection.path: FileProjection(
                data=issued.token.encode("utf-8"), mode=mode, fs_user=args.fs_user
            )
        }
