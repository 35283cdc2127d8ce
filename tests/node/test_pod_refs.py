"""Covers kubevol.node.pod_refs: the pods a change of objects may change, found through the
index, are those found by asking every pod what it refers to."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from kubevol.node.manifests import ApiDict, Manifests
from kubevol.node.pod_refs import ChangedObjects, PodRefs, PodsByObject

NAMES = ("a", "b", "c")

_K = TypeVar("_K", bound=Hashable)


def _pod(i: int, config_maps: list[str], claims: list[str], inline: bool) -> ApiDict:
    volumes: list[dict[str, object]] = [{"name": f"cm-{c}", "configMap": {"name": c}}
                                        for c in config_maps]
    volumes += [{"name": f"pvc-{c}", "persistentVolumeClaim": {"claimName": c}}
                for c in claims]
    volumes += [{"name": f"secret-{c}", "secret": {"secretName": c}} for c in config_maps[:1]]
    if inline:
        volumes.append({"name": "inline", "csi": {"driver": "d"}})
    return {"kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "ns",
                                        "uid": f"00000000-0000-4000-8000-{i:012d}"},
            "spec": {"volumes": volumes}}


def _objects(draw: st.DrawFn) -> Manifests:
    """Fresh objects (new identities) for a random subset of names."""
    config_maps: dict[tuple[str, str], ApiDict] = {
        ("ns", n): {"data": {}} for n in draw(st.sets(st.sampled_from(NAMES)))
    }
    pvcs: dict[tuple[str, str], ApiDict] = {}
    for n in draw(st.sets(st.sampled_from(NAMES))):
        bound = draw(st.sampled_from([None, *NAMES]))
        pvcs[("ns", n)] = {"spec": {"volumeName": f"pv-{bound}"} if bound else {}}
    names = draw(st.sets(st.sampled_from(NAMES)))
    pvs: dict[str, ApiDict] = {f"pv-{n}": {"spec": {}} for n in names}
    drivers: dict[str, ApiDict] = {"d": {}} if draw(st.booleans()) else {}
    secrets: dict[tuple[str, str], ApiDict] = {
        ("ns", n): {"data": {}} for n in draw(st.sets(st.sampled_from(NAMES)))
    }
    return Manifests(config_maps=config_maps, pvcs=pvcs, pvs=pvs, csi_drivers=drivers,
                     secrets=secrets)


@st.composite
def _histories(draw: st.DrawFn) -> list[tuple[Manifests, list[ApiDict]]]:
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        objects = _objects(draw)
        pods = [_pod(i, draw(st.lists(st.sampled_from(NAMES), unique=True)),
                     draw(st.lists(st.sampled_from(NAMES), unique=True)), draw(st.booleans()))
                for i in draw(st.sets(st.integers(0, 5)))]
        steps.append((objects, pods))
    return steps


def _affects_by_asking(refs: PodRefs, changed: ChangedObjects, new: Manifests) -> bool:
    """Whether the pod of ``refs`` may have changed, asked of the pod alone."""
    if refs.config_maps & changed.config_maps or refs.claims & changed.pvcs:
        return True
    if changed.csi_drivers and (refs.claims or refs.csi_inline):
        return True
    steady = {key for key, pvc in new.pvcs.items()
              if (name := (pvc.get("spec") or {}).get("volumeName")) and name not in changed.pvs}
    return bool(changed.pvs) and not refs.claims <= steady


def _mix(old: Mapping[_K, ApiDict], new: Mapping[_K, ApiDict], keep: int) -> dict[_K, ApiDict]:
    """``new``, with some of ``old``'s objects kept as they were (unchanged by identity)."""
    return {k: (old[k] if k in old and hash(k) % 3 < keep else v) for k, v in new.items()}


def _keep_some(old: Manifests, new: Manifests, keep: int) -> Manifests:
    return Manifests(config_maps=_mix(old.config_maps, new.config_maps, keep),
                     pvcs=_mix(old.pvcs, new.pvcs, keep), pvs=_mix(old.pvs, new.pvs, keep),
                     csi_drivers=old.csi_drivers if keep else new.csi_drivers,
                     secrets=_mix(old.secrets, new.secrets, keep))


@settings(max_examples=300, deadline=None)
@given(history=_histories(), keep=st.integers(0, 3))
def test_the_index_finds_what_asking_every_pod_finds(
    history: list[tuple[Manifests, list[ApiDict]]], keep: int
) -> None:
    index = PodsByObject()
    present: dict[str, PodRefs] = {}
    last = Manifests()
    for objects, pods in history:
        new = _keep_some(last, objects, keep)
        refs = [PodRefs.of(p) for p in pods]
        for uid in present.keys() - {r.uid for r in refs}:
            index.remove(present.pop(uid))
        for r in refs:
            if r.uid in present:
                index.remove(present[r.uid])
            index.add(r)
            present[r.uid] = r
        changed = ChangedObjects(last, new)
        expected = {r.uid for r in refs if _affects_by_asking(r, changed, new)}
        assert index.affected(changed, new.pvcs) == expected
        assert index.secret_users(changed) == {r.uid for r in refs if r.secrets & changed.secrets}
        last = new
