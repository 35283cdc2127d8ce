"""Manifests as the node volume manager reads them: YAML files (or recorded objects) of
Pods, PersistentVolumes and PersistentVolumeClaims, checked, with claims resolved to their
PersistentVolumes and pods given a stable UID.

A manifest file is YAML with one or more documents (or a ``kind: List``). A claim is
resolved to its PersistentVolume through ``spec.volumeName``, else the PV whose ``claimRef``
names the claim. A pod without ``metadata.uid`` gets a UID derived from its namespace and
name, so the same manifest always means the same pod.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from kubevol import safeyaml
from kubevol.errors import SpecError, UntrustedDataError
from kubevol.layout import validate_path_segment
from kubevol.spec import deserialize

#: Namespace for UIDs derived from ``namespace/name`` when a manifest has none.
_UID_NAMESPACE = uuid.UUID("6f1c1f36-9b0e-4c4f-8a8b-0c2d6b1b7a10")


@attrs.frozen(kw_only=True)
class Manifests:
    """Objects loaded from manifest files, as dicts: pods in order, PVs by name, PVCs by
    ``(namespace, name)``."""

    pods: tuple[dict[str, Any], ...] = ()
    pvs: Mapping[str, dict[str, Any]] = attrs.field(factory=dict)
    pvcs: Mapping[tuple[str, str], dict[str, Any]] = attrs.field(factory=dict)

    def merged(self, other: Manifests) -> Manifests:
        """Both sets of objects; ``other`` wins on a name clash."""
        return Manifests(
            pods=self.pods + other.pods,
            pvs={**self.pvs, **other.pvs},
            pvcs={**self.pvcs, **other.pvcs},
        )

    def objects_for(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The pod, then the claims and volumes it refers to (what a record keeps)."""
        out: list[dict[str, Any]] = [dict(pod)]
        namespace = namespace_of(pod)
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim:
                continue
            pvc = self.pvcs.get((namespace, claim))
            if pvc is not None:
                out.append(pvc)
                pv = self.pv_for_claim(pvc, namespace, claim)
                if pv is not None:
                    out.append(pv)
        return out

    def pv_for_claim(
        self, pvc: Mapping[str, Any], namespace: str, claim: str
    ) -> dict[str, Any] | None:
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


def namespace_of(obj: Mapping[str, Any]) -> str:
    """An object's ``metadata.namespace``, ``default`` when unset."""
    return str((obj.get("metadata") or {}).get("namespace") or "default")


def name_of(obj: Mapping[str, Any], where: str) -> str:
    """An object's ``metadata.name``; :class:`~kubevol.errors.SpecError` naming ``where``
    when it has none."""
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        raise SpecError(f"a {obj.get('kind', 'manifest')} in {where} has no metadata.name")
    return str(name)


def parse_manifests(text: str, where: str = "<manifest>") -> Manifests:
    """Pods, PVs and PVCs from YAML ``text`` (several documents or ``kind: List``).

    Raises :class:`~kubevol.errors.SpecError` naming ``where`` for invalid YAML, an
    unsupported kind or an object without a name.
    """
    try:
        docs = [d for d in safeyaml.load_all(text, where) if d is not None]
    except UntrustedDataError as exc:
        raise SpecError(str(exc)) from exc
    return manifests_from_objects(docs, where)


def manifests_from_objects(objects: Iterable[Any], where: str) -> Manifests:
    """Pods, PVs and PVCs among objects already loaded (``kind: List`` expanded), checked as
    :func:`parse_manifests` checks them; raises :class:`~kubevol.errors.SpecError` naming
    ``where`` likewise."""
    pods: list[dict[str, Any]] = []
    pvs: dict[str, dict[str, Any]] = {}
    pvcs: dict[tuple[str, str], dict[str, Any]] = {}
    queue = list(objects)
    while queue:
        doc = queue.pop(0)
        if not isinstance(doc, dict):
            raise SpecError(f"{where}: every document must be a mapping, got {type(doc).__name__}")
        kind = doc.get("kind")
        if kind == "List":
            queue[:0] = list(doc.get("items") or [])
        elif kind == "Pod":
            name_of(doc, where)
            pods.append(doc)
        elif kind == "PersistentVolume":
            pvs[name_of(doc, where)] = doc
        elif kind == "PersistentVolumeClaim":
            pvcs[(namespace_of(doc), name_of(doc, where))] = doc
        else:
            raise SpecError(
                f"{where}: kind {kind!r} is not supported; expected Pod, PersistentVolume, "
                "PersistentVolumeClaim or List"
            )
    return Manifests(pods=tuple(pods), pvs=pvs, pvcs=pvcs)


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


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's ``metadata.uid``, else a UID derived from ``namespace/name``; validated."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        uid = str(uuid.uuid5(_UID_NAMESPACE, f"{namespace_of(pod)}/{meta.get('name', '')}"))
    return validate_path_segment(str(uid), "pod UID")


def pod_object(pod: Mapping[str, Any]) -> Any:
    """The ``V1Pod`` of a pod manifest, with its UID filled in."""
    data = dict(pod)
    data["metadata"] = {**(pod.get("metadata") or {}), "uid": pod_uid(pod)}
    return deserialize(data, "V1Pod")
