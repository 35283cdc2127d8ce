"""Pods as the node volume manager sees them: loaded from manifests, turned into desired
volumes, and recorded on disk so that one-shot commands agree across runs and crashes.

A manifest file is YAML with one or more documents (or a ``kind: List``): Pods,
PersistentVolumes and PersistentVolumeClaims. A pod volume with a ``persistentVolumeClaim``
is resolved to its PersistentVolume through the claim (``spec.volumeName``, else the PV whose
``claimRef`` names the claim). A pod without ``metadata.uid`` gets a stable one derived from
its namespace and name, so the same manifest always means the same pod.

:class:`PodRecords` keeps, under ``<root>/kubevol/pods/``, one file per pod that kubevol was
asked to run (``running``) or to stop (``terminating``), holding the manifests it came from.
The file is written before anything is mounted and removed only after everything is torn
down, so a crash at any point leaves enough on disk to finish the job.
"""

from __future__ import annotations

import enum
import json
import os
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import yaml

from kubevol.errors import KubevolError, SpecError
from kubevol.host import NodeVolumeHost
from kubevol.layout import validate_path_segment
from kubevol.manager import VolumePluginMgr
from kubevol.node.state import DesiredPod, VolumeMode, VolumeToMount, unique_volume_name
from kubevol.spec import Spec, deserialize, quantity_bytes

#: Namespace for UIDs derived from ``namespace/name`` when a manifest has none.
_UID_NAMESPACE = uuid.UUID("6f1c1f36-9b0e-4c4f-8a8b-0c2d6b1b7a10")

#: kubevol's own directory under the kubelet root.
STATE_DIR = "kubevol"


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
        namespace = _namespace(pod)
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim:
                continue
            pvc = self.pvcs.get((namespace, claim))
            if pvc is not None:
                out.append(pvc)
                pv = self._pv_for(pvc, namespace, claim)
                if pv is not None:
                    out.append(pv)
        return out

    def _pv_for(self, pvc: Mapping[str, Any], namespace: str, claim: str) -> dict[str, Any] | None:
        name = (pvc.get("spec") or {}).get("volumeName")
        if name:
            return self.pvs.get(name)
        for pv in self.pvs.values():
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if ref.get("name") == claim and (ref.get("namespace") or "default") == namespace:
                return pv
        return None


def _namespace(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "default")


def _name(obj: Mapping[str, Any], where: str) -> str:
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
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError(f"{where} is not valid YAML: {exc}") from exc
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
            _name(doc, where)
            pods.append(doc)
        elif kind == "PersistentVolume":
            pvs[_name(doc, where)] = doc
        elif kind == "PersistentVolumeClaim":
            pvcs[(_namespace(doc), _name(doc, where))] = doc
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
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise SpecError(f"cannot read manifest {path!r}: {exc.strerror}") from exc
        out = out.merged(parse_manifests(text, path))
    return out


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's ``metadata.uid``, else a UID derived from ``namespace/name``; validated."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        uid = str(uuid.uuid5(_UID_NAMESPACE, f"{_namespace(pod)}/{meta.get('name', '')}"))
    return validate_path_segment(str(uid), "pod UID")


def pod_object(pod: Mapping[str, Any]) -> Any:
    """The ``V1Pod`` of a pod manifest, with its UID filled in."""
    data = dict(pod)
    data["metadata"] = {**(pod.get("metadata") or {}), "uid": pod_uid(pod)}
    return deserialize(data, "V1Pod")


def _block_volume_names(pod: Mapping[str, Any]) -> set[str]:
    spec = pod.get("spec") or {}
    names = set()
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for device in container.get("volumeDevices") or []:
            names.add(device.get("name"))
    return names


def desired_pod(
    mgr: VolumePluginMgr, pod: Mapping[str, Any], manifests: Manifests
) -> DesiredPod:
    """The pod's volumes as the reconciler needs them.

    Raises :class:`~kubevol.errors.SpecError` for a claim or volume that cannot be resolved,
    and the manager's lookup errors when no (or several) plugins support a volume.
    """
    uid = pod_uid(pod)
    v1pod = pod_object(pod)
    where = f"pod {_namespace(pod)}/{_name(pod, 'the manifests')}"
    namespace = _namespace(pod)
    block_names = _block_volume_names(pod)
    context = (pod.get("spec") or {}).get("securityContext") or {}
    fs_group = context.get("fsGroup")
    volumes = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        outer = volume.get("name")
        if not outer:
            raise SpecError(f"{where} has a volume without a name")
        spec, mode, size = _spec_for(volume, namespace, manifests, where)
        if (outer in block_names) != (mode is VolumeMode.BLOCK):
            raise SpecError(
                f"{where}: volume {outer!r} is used as "
                f"{'a device' if outer in block_names else 'a mount'} but its volume mode is "
                f"{mode.value}"
            )
        volumes.append(
            volume_to_mount(
                mgr, spec, v1pod, uid, outer, mode=mode, fs_group=fs_group, size=size
            )
        )
    return DesiredPod(uid=uid, pod=v1pod, volumes=tuple(volumes))


def _spec_for(
    volume: Mapping[str, Any], namespace: str, manifests: Manifests, where: str
) -> tuple[Spec, VolumeMode, int | None]:
    source = volume.get("persistentVolumeClaim")
    if not source:
        return Spec.from_manifest(dict(volume)), VolumeMode.FILESYSTEM, None
    claim = source.get("claimName")
    pvc = manifests.pvcs.get((namespace, claim))
    if pvc is None:
        raise SpecError(
            f"{where}: PersistentVolumeClaim {namespace}/{claim} is not in the manifests"
        )
    pv = manifests._pv_for(pvc, namespace, claim)
    if pv is None:
        raise SpecError(
            f"{where}: PersistentVolumeClaim {namespace}/{claim} is not bound to any "
            "PersistentVolume in the manifests (set spec.volumeName)"
        )
    read_only = bool(source.get("readOnly"))
    spec = Spec.from_manifest(pv, read_only=read_only)
    pv_spec = pv.get("spec") or {}
    mode = VolumeMode(pv_spec.get("volumeMode") or VolumeMode.FILESYSTEM.value)
    capacity = (pv_spec.get("capacity") or {}).get("storage")
    return spec, mode, quantity_bytes(capacity)


def volume_to_mount(
    mgr: VolumePluginMgr,
    spec: Spec,
    pod: Any,
    uid: str,
    outer_name: str,
    *,
    mode: VolumeMode = VolumeMode.FILESYSTEM,
    fs_group: int | None = None,
    size: int | None = None,
) -> VolumeToMount:
    """A :class:`VolumeToMount` for ``spec`` in ``pod``: finds the plugin and its roles (one
    lookup), the unique name and the device mount path (filesystem volumes)."""
    roles = mgr.find_roles_by_spec(spec)
    name = roles.name
    device_plugin, attachable = roles.device_mountable, roles.attachable is not None
    volume_name = roles.plugin.get_volume_name(spec)
    device_mount_path = ""
    if mode is VolumeMode.BLOCK:
        # The global map path is learnt when mapping: making a mapper may write metadata.
        if roles.mapper is None:
            raise SpecError(f"volume {outer_name!r}: plugin {name!r} cannot map block volumes")
    elif device_plugin is not None:
        device_mount_path = device_plugin.new_device_mounter().get_device_mount_path(spec)
    return VolumeToMount(
        unique_name=unique_volume_name(
            name, volume_name, shared=device_plugin is not None or attachable, pod_uid=uid,
            spec_name=spec.name(),
        ),
        volume_name=volume_name,
        plugin_name=name,
        pod_uid=uid,
        pod=pod,
        outer_name=outer_name,
        spec=spec,
        mode=mode,
        attachable=attachable,
        device_mountable=device_plugin is not None,
        device_mount_path=device_mount_path,
        fs_group=fs_group,
        size=size,
    )


class PodState(enum.StrEnum):
    """What kubevol was last asked to do with a recorded pod."""

    RUNNING = "running"
    TERMINATING = "terminating"


@attrs.frozen(kw_only=True)
class PodRecord:
    """A recorded pod: its UID, what was asked, and the manifests it came from."""

    uid: str
    state: PodState
    objects: tuple[dict[str, Any], ...]

    @property
    def name(self) -> str:
        """``namespace/name`` of the pod, or its UID when the record has no manifest."""
        pod = next((o for o in self.objects if o.get("kind") == "Pod"), None)
        if pod is None:
            return self.uid
        return f"{_namespace(pod)}/{(pod.get('metadata') or {}).get('name', '')}"

    def manifests(self) -> Manifests:
        """The record's objects as :class:`Manifests` (checked as manifest files are)."""
        return manifests_from_objects(self.objects, f"record of pod {self.uid}")


#: What identifies one version of a record file: inode, size, modification time (ns).
RecordStamp = tuple[int, int, int]


def _stamp(st: os.stat_result) -> RecordStamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class PodRecords:
    """The pods kubevol runs on a root, one JSON file each under ``<root>/kubevol/pods/``.

    Writes are atomic (temporary file, ``fsync``, ``rename``), so a crash leaves either the
    old or the new record.
    """

    def __init__(self, host: NodeVolumeHost) -> None:
        self.dir = os.path.join(host.root_dir, STATE_DIR, "pods")

    def _path(self, uid: str) -> str:
        return os.path.join(self.dir, validate_path_segment(uid, "pod UID") + ".json")

    def write(self, record: PodRecord) -> RecordStamp:
        """Create or replace the record of ``record.uid``; returns the stamp of the file
        written (what :class:`RecordWatcher` compares)."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        data = {"uid": record.uid, "state": record.state.value, "objects": list(record.objects)}
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
                # The renamed file keeps its inode, size and modification time.
                stamp = _stamp(os.fstat(f.fileno()))
            os.rename(tmp, self._path(record.uid))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return stamp

    def read(self, uid: str) -> PodRecord | None:
        """The record of pod ``uid``, or None."""
        try:
            with open(self._path(uid), encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise KubevolError(f"the record of pod {uid} is unreadable: {exc}") from exc
        return PodRecord(
            uid=str(data["uid"]),
            state=PodState(data["state"]),
            objects=tuple(data.get("objects") or ()),
        )

    def all(self) -> list[PodRecord]:
        """Every record, sorted by UID (unreadable ones raise)."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                record = self.read(name[: -len(".json")])
                if record is not None:
                    out.append(record)
        return out

    def remove(self, uid: str) -> None:
        """Forget pod ``uid``. Idempotent."""
        try:
            os.unlink(self._path(uid))
        except FileNotFoundError:
            return


def records_for(manifests: Manifests, state: PodState) -> list[PodRecord]:
    """One record per pod in ``manifests``, each with the objects it refers to."""
    return [
        PodRecord(uid=pod_uid(p), state=state, objects=tuple(manifests.objects_for(p)))
        for p in manifests.pods
    ]


@attrs.frozen(kw_only=True)
class NewPod:
    """A pod to run: the record that keeps it and its desired volumes, built from the same
    manifests once."""

    record: PodRecord
    desired: DesiredPod


def new_pods(mgr: VolumePluginMgr, manifests: Manifests) -> list[NewPod]:
    """Every pod of ``manifests``, checked and built (:func:`desired_pod`), with its
    ``running`` record; nothing is written. Raises as :func:`desired_pod` does for the
    first pod that is not valid."""
    return [
        NewPod(
            record=PodRecord(
                uid=pod_uid(p), state=PodState.RUNNING, objects=tuple(manifests.objects_for(p))
            ),
            desired=desired_pod(mgr, p, manifests),
        )
        for p in manifests.pods
    ]


def describe_pods(records: Sequence[PodRecord]) -> dict[str, str]:
    """UID → ``namespace/name`` of recorded pods."""
    return {r.uid: r.name for r in records}


class RecordWatcher:
    """Re-reads only the records that changed since the last :meth:`refresh` (by inode,
    size and modification time), for agents that poll the records."""

    def __init__(self, records: PodRecords) -> None:
        self.records = records
        self._cache: dict[str, tuple[RecordStamp, PodRecord]] = {}

    def note(self, record: PodRecord, stamp: RecordStamp) -> None:
        """Know ``record`` as the content of its file at ``stamp`` (its writer's own
        :meth:`PodRecords.write`): the next :meth:`refresh` does not read it back, nor
        report it changed, unless the file changed since."""
        self._cache[record.uid] = (stamp, record)

    def refresh(self) -> tuple[dict[str, PodRecord], set[str]]:
        """All records by UID, and the UIDs whose record appeared, changed or went."""
        try:
            names = os.listdir(self.records.dir)
        except FileNotFoundError:
            names = []
        seen: dict[str, tuple[RecordStamp, PodRecord]] = {}
        changed: set[str] = set()
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            uid = name[: -len(".json")]
            try:
                st = os.stat(os.path.join(self.records.dir, name))
            except FileNotFoundError:
                continue
            stamp = _stamp(st)
            cached = self._cache.get(uid)
            if cached is not None and cached[0] == stamp:
                seen[uid] = cached
                continue
            record = self.records.read(uid)
            if record is not None:
                seen[uid] = (stamp, record)
                changed.add(uid)
        changed |= set(self._cache) - set(seen)
        self._cache = seen
        return {uid: r for uid, (_, r) in seen.items()}, changed
