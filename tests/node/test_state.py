"""Covers kubevol.node.state.

The actual state: snapshots that follow every change; the desired state: which volumes
pods want, as pods come, change and go.
"""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from kubevol import Spec
from kubevol.node.state import (
    ActualState,
    AttachedVolume,
    DesiredPod,
    DesiredState,
    MountState,
    VolumeMode,
    VolumeToMount,
)


def _add(state: ActualState, spec: Spec, *, reconstructed: bool = False) -> None:
    state.add_volume(
        unique_name="u", volume_name="v", plugin_name="p", spec=spec,
        mode=VolumeMode.FILESYSTEM, attachable=True, device_mountable=True,
        reconstructed=reconstructed,
    )  # fmt: skip


def _now(state: ActualState) -> AttachedVolume:
    """The volume's snapshot, the same through volume() and volumes()."""
    snapshot = state.volume("u")
    assert snapshot is not None
    assert state.volumes() == [snapshot]
    return snapshot


def test_a_snapshot_is_kept_until_the_volume_changes_and_then_shows_the_change() -> None:
    """Reading twice without a change gives the same snapshot; each kind of change (pod,
    device, attachment, size, a merge, the desired spec over a reconstructed one) shows in
    the next snapshot."""
    state = ActualState()
    _add(state, Spec(volume=client.V1Volume(name="v")), reconstructed=True)
    first = _now(state)
    assert _now(state) is first

    state.set_pod_state("u", "pod-a", MountState.MOUNTED, spec_name="v")
    assert [p.pod_uid for p in _now(state).pods] == ["pod-a"]
    state.set_device_state("u", MountState.MOUNTED, "/dmp")
    assert _now(state).device_mount_path == "/dmp"
    state.set_attach_state("u", MountState.MOUNTED, "/dev/x")
    assert _now(state).device_path == "/dev/x"
    state.set_size("u", 42)
    assert _now(state).size == 42

    other_pod = attrs.evolve(_now(state).pods[0], pod_uid="pod-b")
    state.merge([attrs.evolve(_now(state), pods=(other_pod,))])
    assert [p.pod_uid for p in _now(state).pods] == ["pod-a", "pod-b"]

    desired = Spec(volume=client.V1Volume(name="v"))
    _add(state, desired)
    assert _now(state).spec is desired
    assert not _now(state).reconstructed

    state.set_pod_state("u", "pod-a", MountState.UNMOUNTED)
    assert [p.pod_uid for p in _now(state).pods] == ["pod-b"]


_PODS = st.sampled_from(["p1", "p2", "p3"])
_NAMES = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3)


@given(steps=st.lists(st.tuples(_PODS, st.none() | _NAMES), max_size=12))
def test_is_desired_follows_pods_that_come_change_and_go(
    steps: list[tuple[str, list[str] | None]]
) -> None:
    """A volume is desired while some pod wants it (two pods may want one volume, a pod may
    name it twice); the answer is asked of every pod's volumes."""
    state = DesiredState()
    spec = Spec.from_manifest({"name": "v", "emptyDir": {}})
    for uid, names in steps:
        if names is None:
            state.remove_pod(uid)
        else:
            state.set_pod(DesiredPod(uid=uid, pod=client.V1Pod(), volumes=tuple(
                VolumeToMount(unique_name=n, volume_name=n, plugin_name="p", pod_uid=uid,
                              pod=client.V1Pod(), outer_name=n, spec=spec) for n in names)))
        for name in "abcd":
            wanting = {p.uid for p in state.pods() if any(v.unique_name == name
                                                          for v in p.volumes)}
            assert state.is_desired(name) == bool(wanting)
            for other in ("p1", "p2", "p3"):
                assert state.is_desired(name, other) == (other in wanting)


@given(steps=st.lists(st.tuples(
    st.sampled_from(["set", "set", "set", "remove", "merge", "clear"]),
    st.sampled_from(["u1", "u2"]), st.sampled_from(["p1", "p2"]),
    st.sampled_from(list(MountState))), max_size=12))
def test_the_pods_using_volumes_are_those_of_every_volume(
    steps: list[tuple[str, str, str, MountState]]
) -> None:
    """pods() is kept as the entries change (set, volume removed, merged, cleared); it
    answers as every volume's snapshot does."""
    state = ActualState()
    spec = Spec.from_manifest({"name": "v", "emptyDir": {}})
    for action, unique, pod_uid, mount_state in steps:
        if action == "remove":
            state.remove_volume(unique)
        elif action == "clear":
            state.clear()
        elif action == "merge":
            # What a reconstruction finds: the volume with one more pod, merged in.
            found = ActualState()
            found.add_volume(unique_name=unique, volume_name=unique, plugin_name="p",
                             spec=spec, mode=VolumeMode.FILESYSTEM, attachable=False,
                             device_mountable=False)
            found.set_pod_state(unique, pod_uid, MountState.UNCERTAIN)
            state.merge(found.volumes())
        else:
            state.add_volume(unique_name=unique, volume_name=unique, plugin_name="p",
                             spec=spec, mode=VolumeMode.FILESYSTEM, attachable=False,
                             device_mountable=False)
            state.set_pod_state(unique, pod_uid, mount_state)
        assert state.pods() == {m.pod_uid for m in state.mounted_volumes()}
