"""Desired volumes from manifests: each pod volume resolved to a Spec (a claim through its
PersistentVolume), its plugin and roles found in one lookup, and the pods to run paired
with the records that keep them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kubevol.errors import SpecError
from kubevol.k8s.pod import Pod
from kubevol.manager import VolumePluginMgr
from kubevol.node.manifests import (
    ApiObject,
    Manifests,
    accepted_pod_object,
    check_ephemeral_claim,
    claim_name,
    manifest_pod_uid,
    name_of,
    namespace_of,
    pod_object,
)
from kubevol.node.records import PodRecord, PodState, Writer
from kubevol.node.state import DesiredPod, VolumeMode, VolumeToMount, volume_identity
from kubevol.spec import Spec, quantity_bytes


def _containers(pod: ApiObject) -> list[ApiObject]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _block_volume_names(pod: ApiObject) -> set[str]:
    return {device.get("name") for container in _containers(pod)
            for device in container.get("volumeDevices") or []}


def _sub_path_volume_names(pod: ApiObject) -> set[str]:
    return {mount.get("name") for container in _containers(pod)
            for mount in container.get("volumeMounts") or []
            if mount.get("subPath") or mount.get("subPathExpr")}


def desired_pod(
    mgr: VolumePluginMgr, pod: Mapping[str, Any], manifests: Manifests, *,
    accepted: bool = False,
) -> DesiredPod:
    """The pod's volumes as the reconciler needs them. ``accepted``: the pod and its
    objects were accepted before (its record read back as JSON), so its ``V1Pod`` is built
    when first read (:func:`~kubevol.node.manifests.accepted_pod_object`), not now, and its
    volumes' models are validated in one call (``Spec.from_manifest``'s ``accepted``).

    Raises :class:`~kubevol.errors.SpecError` for a claim or volume that cannot be resolved,
    and the manager's lookup errors when no (or several) plugins support a volume.
    """
    uid = manifest_pod_uid(pod)
    v1pod = accepted_pod_object(pod) if accepted else pod_object(pod)
    where = f"pod {namespace_of(pod)}/{name_of(pod, 'the manifests')}"
    block_names = _block_volume_names(pod)
    sub_path_names = _sub_path_volume_names(pod)
    context = (pod.get("spec") or {}).get("securityContext") or {}
    fs_group = context.get("fsGroup")
    volumes = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        outer = volume.get("name")
        if not outer:
            raise SpecError(f"{where} has a volume without a name")
        spec, mode, size, claim_size = _spec_for(pod, volume, manifests, where, accepted)
        if (outer in block_names) != (mode is VolumeMode.BLOCK):
            raise SpecError(
                f"{where}: volume {outer!r} is used as "
                f"{'a device' if outer in block_names else 'a mount'} but its volume mode is "
                f"{mode.value}"
            )
        volumes.append(
            volume_to_mount(
                mgr, spec, v1pod, uid, outer, mode=mode, fs_group=fs_group, size=size,
                claim_size=claim_size, sub_path=outer in sub_path_names,
            )
        )
    return DesiredPod(uid=uid, pod=v1pod, volumes=tuple(volumes))


def _spec_for(
    pod: Mapping[str, Any], volume: Mapping[str, Any], manifests: Manifests, where: str,
    accepted: bool,
) -> tuple[Spec, VolumeMode, int | None, int | None]:
    """The volume's Spec and mode, the size its PersistentVolume asks for and the size its
    claim's status reports (what the volume had when last expanded), when known."""
    claim = claim_name(pod, volume)
    if not claim:
        spec = Spec.from_manifest(dict(volume), accepted=accepted)
        return spec, VolumeMode.FILESYSTEM, None, None
    namespace = namespace_of(pod)
    pvc = manifests.pvcs.get((namespace, claim))
    ephemeral = volume.get("ephemeral") is not None
    if pvc is None:
        made_by = (" (a generic ephemeral volume's claim, <pod>-<volume>, made by the "
                   "ephemeral volume controller or given with the pod)" if ephemeral else "")
        raise SpecError(
            f"{where}: PersistentVolumeClaim {namespace}/{claim} is not in the manifests"
            f"{made_by}"
        )
    if ephemeral:
        check_ephemeral_claim(pod, pvc)
    source = volume.get("persistentVolumeClaim") or {}
    pv = manifests.pv_for_claim(pvc, namespace, claim)
    if pv is None:
        raise SpecError(
            f"{where}: PersistentVolumeClaim {namespace}/{claim} is not bound to any "
            "PersistentVolume in the manifests (set spec.volumeName)"
        )
    read_only = bool(source.get("readOnly"))
    spec = Spec.from_manifest(pv, read_only=read_only, accepted=accepted)
    pv_spec = pv.get("spec") or {}
    mode = VolumeMode(pv_spec.get("volumeMode") or VolumeMode.FILESYSTEM.value)
    capacity = (pv_spec.get("capacity") or {}).get("storage")
    claimed = ((pvc.get("status") or {}).get("capacity") or {}).get("storage")
    return spec, mode, quantity_bytes(capacity), quantity_bytes(claimed)


def volume_to_mount(
    mgr: VolumePluginMgr,
    spec: Spec,
    pod: Pod,
    uid: str,
    outer_name: str,
    *,
    mode: VolumeMode = VolumeMode.FILESYSTEM,
    fs_group: int | None = None,
    size: int | None = None,
    claim_size: int | None = None,
    sub_path: bool = False,
) -> VolumeToMount:
    """A :class:`VolumeToMount` for ``spec`` in ``pod``: finds the plugin and its roles (one
    lookup), the unique name and the device mount path (filesystem volumes)."""
    roles = mgr.find_roles_by_spec(spec)
    identity = volume_identity(roles, spec, pod_uid=uid, spec_name=spec.name(), mode=mode)
    # The global map path is learnt when mapping: making a mapper may write metadata.
    if mode is VolumeMode.BLOCK and roles.mapper is None:
        raise SpecError(f"volume {outer_name!r}: plugin {roles.name!r} cannot map block volumes")
    return VolumeToMount(
        unique_name=identity.unique_name,
        volume_name=identity.volume_name,
        plugin_name=roles.name,
        pod_uid=uid,
        pod=pod,
        outer_name=outer_name,
        spec=spec,
        mode=mode,
        attachable=identity.attachable,
        device_mountable=identity.device_mountable,
        device_mount_path=identity.device_mount_path,
        fs_group=fs_group,
        size=size,
        claim_size=claim_size,
        sub_path=sub_path,
    )

@attrs.frozen(kw_only=True)
class NewPod:
    """A pod to run: the record that keeps it and its desired volumes, built from the same
    manifests once."""

    record: PodRecord
    desired: DesiredPod


def new_pods(
    mgr: VolumePluginMgr, manifests: Manifests, writer: Writer = Writer.UP
) -> list[NewPod]:
    """Every pod of ``manifests``, checked and built (:func:`desired_pod`), with its
    ``running`` record by ``writer``; nothing is written. Raises as :func:`desired_pod`
    does for the first pod that is not valid."""
    return [
        NewPod(
            record=PodRecord(
                uid=manifest_pod_uid(p),
                state=PodState.RUNNING,
                objects=tuple(manifests.objects_for(p)),
                writer=writer,
            ),
            desired=desired_pod(mgr, p, manifests),
        )
        for p in manifests.pods
    ]
