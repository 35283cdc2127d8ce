"""What the pods of the agent's sources refer to by name (ConfigMaps, claims, CSI drivers),
and which pods a change of those objects may change: found through an index from each object
to the pods that use it, so that a change costs what it touches, not a look at every pod."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

import attrs

from kubevol.node.manifests import (
    ApiDict,
    Manifests,
    claim_name,
    manifest_pod_uid,
    namespace_of,
    referenced_config_maps,
    referenced_secrets,
)

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V", bound=Hashable)

#: A namespaced object's key: ``(namespace, name)``.
Key = tuple[str, str]


@attrs.frozen(kw_only=True)
class PodRefs:
    """What a pod manifest refers to by name: its UID, ConfigMaps, Secrets its volumes
    project and claims (by namespace and name), and whether it has inline CSI volumes."""

    pod: ApiDict
    uid: str
    config_maps: frozenset[Key]
    secrets: frozenset[Key]
    claims: frozenset[Key]
    csi_inline: bool

    @classmethod
    def of(cls, pod: ApiDict) -> PodRefs:
        namespace = namespace_of(pod)
        volumes = (pod.get("spec") or {}).get("volumes") or []
        return cls(
            pod=pod, uid=manifest_pod_uid(pod),
            config_maps=frozenset((namespace, n) for n in referenced_config_maps(pod)),
            secrets=frozenset((namespace, n) for n in referenced_secrets(pod)),
            claims=frozenset((namespace, c) for v in volumes if (c := claim_name(pod, v))),
            csi_inline=any(v.get("csi") is not None for v in volumes),
        )


class ChangedObjects:
    """The objects other than pods that differ between two sets of manifests (by identity:
    a file read again gives new objects)."""

    def __init__(self, old: Manifests, new: Manifests) -> None:
        #: The ConfigMaps, Secrets and CSIDriver objects of ``new`` that ``old`` does not
        #: have as they are.
        self.fresh_config_maps = self._fresh(old.config_maps, new.config_maps)
        self.fresh_secrets = self._fresh(old.secrets, new.secrets)
        self.fresh_csi_drivers = self._fresh(old.csi_drivers, new.csi_drivers)
        #: The names of the objects that changed, came or went.
        self.config_maps = self._keys(old.config_maps, new.config_maps, self.fresh_config_maps)
        self.secrets = self._keys(old.secrets, new.secrets, self.fresh_secrets)
        self.pvcs = self._keys(old.pvcs, new.pvcs, self._fresh(old.pvcs, new.pvcs))
        self.pvs = self._keys(old.pvs, new.pvs, self._fresh(old.pvs, new.pvs))
        self.csi_drivers = bool(
            self._keys(old.csi_drivers, new.csi_drivers, self.fresh_csi_drivers)
        )

    @staticmethod
    def _fresh(old: Mapping[_K, ApiDict], new: Mapping[_K, ApiDict]) -> dict[_K, ApiDict]:
        if old is new:
            return {}
        return {k: v for k, v in new.items() if old.get(k) is not v}

    @staticmethod
    def _keys(
        old: Mapping[_K, ApiDict], new: Mapping[_K, ApiDict], fresh: Mapping[_K, ApiDict]
    ) -> set[_K]:
        if old is new:
            return set()
        return {*fresh, *(old.keys() - new.keys())}


class PodsByObject:
    """The pods (by UID) that refer to each ConfigMap and claim, and the PV each claim is
    bound to (its ``spec.volumeName``): which pods a change of objects may change.

    Kept current by :meth:`add` and :meth:`remove` as pods come, change and go, and by
    :meth:`affected` as claims change."""

    def __init__(self) -> None:
        self._by_config_map: dict[Key, set[str]] = {}
        self._by_secret: dict[Key, set[str]] = {}
        self._by_claim: dict[Key, set[str]] = {}
        #: Pods with a claim or an inline CSI volume: what a CSIDriver object may change.
        self._with_csi: set[str] = set()
        #: The claims pods use that are not bound by name (missing, unbound, or bound
        #: through the PV's ``claimRef``): what a change of any PV may change.
        self._loose: set[Key] = set()
        #: The PV name of each claim bound by ``spec.volumeName``, and the reverse.
        self._claim_pv: dict[Key, str] = {}
        self._claims_of_pv: dict[str, set[Key]] = {}

    def add(self, refs: PodRefs) -> None:
        _index(self._by_config_map, refs.config_maps, refs.uid)
        _index(self._by_secret, refs.secrets, refs.uid)
        _index(self._by_claim, refs.claims, refs.uid)
        self._loose.update(refs.claims - self._claim_pv.keys())
        if refs.claims or refs.csi_inline:
            self._with_csi.add(refs.uid)

    def remove(self, refs: PodRefs) -> None:
        _unindex(self._by_config_map, refs.config_maps, refs.uid)
        _unindex(self._by_secret, refs.secrets, refs.uid)
        _unindex(self._by_claim, refs.claims, refs.uid)
        self._loose.difference_update(refs.claims - self._by_claim.keys())
        self._with_csi.discard(refs.uid)

    def affected(self, changed: ChangedObjects, pvcs: Mapping[Key, ApiDict]) -> set[str]:
        """The UIDs of the pods whose objects may have changed with ``changed`` (``pvcs``:
        the claims now): a ConfigMap or claim they use, a CSIDriver object when they have
        CSI volumes, a PV their claim is bound to; with PVs changed, also the pods with a
        claim not bound by name (missing, or bound through the PV's ``claimRef``)."""
        for key in changed.pvcs:
            self._bind(key, pvcs.get(key))
        out: set[str] = set()
        for key in changed.config_maps:
            out |= self._by_config_map.get(key, set())
        for key in changed.pvcs:
            out |= self._by_claim.get(key, set())
        if changed.csi_drivers:
            out |= self._with_csi
        if changed.pvs:
            claims = set(self._loose)
            for name in changed.pvs:
                claims |= self._claims_of_pv.get(name, set())
            for key in claims:
                out |= self._by_claim.get(key, set())
        return out

    def secret_users(self, changed: ChangedObjects) -> set[str]:
        """The UIDs of the pods whose volumes project a Secret that changed (a record keeps
        no Secret: such a pod is not built anew, only set up again)."""
        out: set[str] = set()
        for key in changed.secrets:
            out |= self._by_secret.get(key, set())
        return out

    def _bind(self, key: Key, pvc: ApiDict | None) -> None:
        """Follow the binding of claim ``key`` (None: the claim is gone)."""
        old = self._claim_pv.pop(key, None)
        if old is not None:
            _unindex(self._claims_of_pv, (old,), key)
        name = (pvc.get("spec") or {}).get("volumeName") if pvc is not None else None
        if name:
            self._claim_pv[key] = str(name)
            _index(self._claims_of_pv, (str(name),), key)
            self._loose.discard(key)
        elif key in self._by_claim:
            self._loose.add(key)


def _index(index: dict[_K, set[_V]], keys: Iterable[_K], value: _V) -> None:
    for key in keys:
        index.setdefault(key, set()).add(value)


def _unindex(index: dict[_K, set[_V]], keys: Iterable[_K], value: _V) -> None:
    for key in keys:
        values = index.get(key)
        if values is not None:
            values.discard(value)
            if not values:
                del index[key]
