"""Manifests as the node volume manager reads them: YAML files (or recorded objects) of
Pods, PersistentVolumes and PersistentVolumeClaims, the ConfigMaps and Secrets that
configMap, secret and projected volumes read (:mod:`kubevol.k8s.objects`), and CSIDriver
objects (how to treat a driver, on a node without an API server), checked, with claims
resolved to their PersistentVolumes and pods given a stable UID.

A manifest file is YAML with one or more documents (or a ``kind: List``). A claim is
resolved to its PersistentVolume through ``spec.volumeName``, else the PV whose ``claimRef``
names the claim. A pod without ``metadata.uid`` gets a UID derived from its namespace and
name, so the same manifest always means the same pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kubevol.errors import SpecError, UntrustedDataError
from kubevol.k8s.objects import config_map_from_dict, secret_from_dict
from kubevol.node.validation import (
    validate_claim,
    validate_persistent_volume,
    validate_pod,
    validate_pod_uid,
)
from kubevol.plugins.csi.driverinfo import CSIDriverInfoError, check_csidriver
from kubevol.spec import DeferredApiObject, deserialize
from kubevol.util import safeyaml

if TYPE_CHECKING:
    from kubernetes.client import V1Pod

#: An API object as its JSON dict (what a manifest's documents are).
ApiDict = dict[str, Any]
#: An API object only read.
ApiObject = Mapping[str, Any]

#: Namespace for UIDs derived from ``namespace/name`` when a manifest has none.
_UID_NAMESPACE = uuid.UUID("6f1c1f36-9b0e-4c4f-8a8b-0c2d6b1b7a10")


@attrs.frozen(kw_only=True)
class Manifests:
    """Objects loaded from manifest files, as dicts: pods in order, PVs by name, PVCs by
    ``(namespace, name)``."""

    pods: tuple[ApiDict, ...] = ()
    pvs: Mapping[str, ApiDict] = attrs.field(factory=dict)
    pvcs: Mapping[tuple[str, str], ApiDict] = attrs.field(factory=dict)
    #: ConfigMaps and Secrets by ``(namespace, name)``.
    config_maps: Mapping[tuple[str, str], ApiDict] = attrs.field(factory=dict)
    secrets: Mapping[tuple[str, str], ApiDict] = attrs.field(factory=dict)
    #: CSIDriver objects by name (cluster-scoped), with the API server's defaults.
    csi_drivers: Mapping[str, ApiDict] = attrs.field(factory=dict)

    def merged(self, other: Manifests) -> Manifests:
        """Both sets of objects; ``other`` wins on a name clash."""
        return Manifests(
            pods=self.pods + other.pods,
            pvs={**self.pvs, **other.pvs},
            pvcs={**self.pvcs, **other.pvcs},
            config_maps={**self.config_maps, **other.config_maps},
            secrets={**self.secrets, **other.secrets},
            csi_drivers={**self.csi_drivers, **other.csi_drivers},
        )

    def api_objects(self) -> list[ApiDict]:
        """The ConfigMaps and Secrets, for a :class:`~kubevol.k8s.objects.ManifestObjects`."""
        return [*self.config_maps.values(), *self.secrets.values()]

    def objects_for(self, pod: ApiObject) -> list[ApiDict]:
        """The pod, then the claims, volumes and ConfigMaps it refers to (what a record
        keeps), and the CSIDriver objects of the drivers its volumes use. Never a Secret:
        secret data stays in memory (tmpfs volumes), as on a kubelet node, so after a
        restart a Secret comes from the manifests again or from the API server."""
        out: list[ApiDict] = [dict(pod)]
        namespace = namespace_of(pod)
        for name in sorted(referenced_config_maps(pod)):
            config_map = self.config_maps.get((namespace, name))
            if config_map is not None:
                out.append(config_map)
        drivers: set[str] = set()
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            drivers.add(str((volume.get("csi") or {}).get("driver") or ""))
            claim = claim_name(pod, volume)
            if not claim:
                continue
            pvc = self.pvcs.get((namespace, claim))
            if pvc is not None:
                out.append(pvc)
                pv = self.pv_for_claim(pvc, namespace, claim)
                if pv is not None:
                    out.append(pv)
                    drivers.add(str(((pv.get("spec") or {}).get("csi") or {}).get("driver") or ""))
        out += [self.csi_drivers[d] for d in sorted(drivers) if d in self.csi_drivers]
        return out

    def pv_for_claim(
        self, pvc: ApiObject, namespace: str, claim: str
    ) -> ApiDict | None:
        """The PersistentVolume bound to claim ``namespace/claim`` (its ``spec.volumeName``,
        else the PV whose ``claimRef`` names it), None when the manifests have none."""
        name = (pvc.get("spec") or {}).get("volumeName")
        if name:
            return self.pvs.get(name)
        for pv in self.pvs.values():
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if ref.get("name") == claim and (ref.get("namespace") or "default") == namespace:
                return pv
        return None


def claim_name(pod: ApiObject, volume: ApiObject) -> str | None:
    """The PersistentVolumeClaim a pod volume uses: ``persistentVolumeClaim.claimName``, or
    for a generic ephemeral volume (``ephemeral.volumeClaimTemplate``) the claim the
    ephemeral volume controller made for the pod, ``<pod name>-<volume name>``
    (``k8s.io/component-helpers/storage/ephemeral``'s ``VolumeClaimName``); None for other
    volumes."""
    if volume.get("ephemeral") is not None:
        return f"{(pod.get('metadata') or {}).get('name', '')}-{volume.get('name', '')}"
    claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
    return str(claim) if claim else None


def check_ephemeral_claim(pod: ApiObject, pvc: ApiObject) -> None:
    """Refuse a generic ephemeral volume's claim that was not made for ``pod``, as the
    kubelet does (``VolumeIsForPod``): same namespace, and the pod (by UID) its controlling
    owner. Raises :class:`~kubevol.errors.SpecError` with the kubelet's words."""
    owners = (pvc.get("metadata") or {}).get("ownerReferences") or []
    controller = next((o for o in owners if isinstance(o, Mapping) and o.get("controller")),
                      None)
    if namespace_of(pvc) != namespace_of(pod) or controller is None or (
            controller.get("uid") != manifest_pod_uid(pod)):
        raise SpecError(
            f"PVC {namespace_of(pvc)}/{name_of(pvc, 'the manifests')} was not created for pod "
            f"{namespace_of(pod)}/{name_of(pod, 'the manifests')} (pod is not owner)")


def referenced_config_maps(pod: ApiObject) -> set[str]:
    """Names of the ConfigMaps a pod reads: configMap volumes, projected configMap sources
    and containers' ``configMapKeyRef`` variables (subPathExpr may use them)."""
    spec = pod.get("spec") or {}
    names: set[str] = set()
    for volume in spec.get("volumes") or []:
        if (volume.get("configMap") or {}).get("name"):
            names.add(str(volume["configMap"]["name"]))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if (source.get("configMap") or {}).get("name"):
                names.add(str(source["configMap"]["name"]))
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for var in container.get("env") or []:
            ref = (var.get("valueFrom") or {}).get("configMapKeyRef") or {}
            if ref.get("name"):
                names.add(str(ref["name"]))
    return names


def referenced_secrets(pod: ApiObject) -> set[str]:
    """Names of the Secrets a pod's volumes project: secret volumes and projected secret
    sources (what a changed Secret sets up again)."""
    names: set[str] = set()
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if (volume.get("secret") or {}).get("secretName"):
            names.add(str(volume["secret"]["secretName"]))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if (source.get("secret") or {}).get("name"):
                names.add(str(source["secret"]["name"]))
    return names


def namespace_of(obj: ApiObject) -> str:
    """An object's ``metadata.namespace``, ``default`` when unset."""
    return str((obj.get("metadata") or {}).get("namespace") or "default")


def name_of(obj: ApiObject, where: str) -> str:
    """An object's ``metadata.name``; :class:`~kubevol.errors.SpecError` naming ``where``
    when it has none."""
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        raise SpecError(f"a {obj.get('kind', 'manifest')} in {where} has no metadata.name")
    return str(name)


def parse_manifests(text: str, where: str = "<manifest>") -> Manifests:
    """Pods, PVs, PVCs, ConfigMaps and Secrets from YAML ``text`` (several documents or
    ``kind: List``).

    Raises :class:`~kubevol.errors.SpecError` naming ``where`` for invalid YAML, an
    unsupported kind or an object without a name.
    """
    try:
        docs = [d for d in safeyaml.load_all(text, where) if d is not None]
    except UntrustedDataError as exc:
        raise SpecError(str(exc)) from exc
    return manifests_from_objects(docs, where)


def manifests_from_objects(objects: Iterable[object], where: str) -> Manifests:
    """Pods, PVs and PVCs among objects already loaded (``kind: List`` expanded), checked as
    :func:`parse_manifests` checks them; raises :class:`~kubevol.errors.SpecError` naming
    ``where`` likewise."""
    pods: list[ApiDict] = []
    pvs: dict[str, ApiDict] = {}
    pvcs: dict[tuple[str, str], ApiDict] = {}
    config_maps: dict[tuple[str, str], ApiDict] = {}
    secrets: dict[tuple[str, str], ApiDict] = {}
    csi_drivers: dict[str, ApiDict] = {}
    queue = list(objects)
    while queue:
        doc = queue.pop(0)
        if not isinstance(doc, dict):
            raise SpecError(f"{where}: every document must be a mapping, got {type(doc).__name__}")
        kind = doc.get("kind")
        if kind == "List":
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise SpecError(f"{where}: the items of a List must be a list")
            queue[:0] = items
        elif kind == "Pod":
            validate_pod(doc, where)
            pods.append(doc)
        elif kind == "PersistentVolume":
            validate_persistent_volume(doc, where)
            pvs[name_of(doc, where)] = doc
        elif kind == "PersistentVolumeClaim":
            validate_claim(doc, where)
            pvcs[(namespace_of(doc), name_of(doc, where))] = doc
        elif kind in ("ConfigMap", "Secret"):
            # Checked now (shapes, base64), so a bad object fails before anything is done.
            (config_map_from_dict if kind == "ConfigMap" else secret_from_dict)(doc, where)
            found = config_maps if kind == "ConfigMap" else secrets
            found[(namespace_of(doc), name_of(doc, where))] = doc
        elif kind == "CSIDriver":
            try:
                checked = check_csidriver(doc)
            except CSIDriverInfoError as exc:
                raise SpecError(f"{where}: {exc}") from exc
            csi_drivers[name_of(doc, where)] = checked
        else:
            raise SpecError(
                f"{where}: kind {kind!r} is not supported; expected Pod, PersistentVolume, "
                "PersistentVolumeClaim, ConfigMap, Secret, CSIDriver or List"
            )
    return Manifests(pods=tuple(pods), pvs=pvs, pvcs=pvcs, config_maps=config_maps,
                     secrets=secrets, csi_drivers=csi_drivers)


def load_manifest_files(paths: Iterable[str]) -> Manifests:
    """:func:`parse_manifests` over every file in ``paths``, merged."""
    out = Manifests()
    for path in paths:
        try:
            text = safeyaml.read_manifest(path)
        except OSError as exc:
            raise SpecError(f"cannot read manifest {path!r}: {exc.strerror}") from exc
        except UntrustedDataError as exc:
            raise SpecError(str(exc)) from exc
        out = out.merged(parse_manifests(text, path))
    return out


def manifest_pod_uid(pod: ApiObject) -> str:
    """The pod's ``metadata.uid``, else a UID derived from ``namespace/name``; validated."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        uid = str(uuid.uuid5(_UID_NAMESPACE, f"{namespace_of(pod)}/{meta.get('name', '')}"))
    return validate_pod_uid(uid)


def pod_object(pod: ApiObject) -> V1Pod:
    """The ``V1Pod`` of a pod manifest, with its UID filled in."""
    return deserialize(_with_uid(pod), "V1Pod")


def accepted_pod_object(pod: ApiObject) -> DeferredApiObject:
    """The ``V1Pod`` of a pod accepted before (its record read back, checked as manifest
    files are), built when first read: at a restart, the pod models (and the import of
    their classes, 0.1-0.2 s) are not needed to find the node as it was left."""
    return DeferredApiObject("V1Pod", _with_uid(pod))


def _with_uid(pod: ApiObject) -> ApiObject:
    data = dict(pod)
    data["metadata"] = {**(pod.get("metadata") or {}), "uid": manifest_pod_uid(pod)}
    return data
