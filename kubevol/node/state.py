"""The desired and actual state of a node's volumes (the kubelet's two "worlds").

**Desired state**: which pods should run here and which volumes each needs, as
:class:`VolumeToMount` entries. **Actual state**: what is true on the node, per volume
(keyed by its unique name): attached or not, device mounted or not, and for each pod
whether its volume is set up. Every "is it there?" has a third answer, *uncertain*: an
operation was interrupted or a volume was rebuilt from disk, so the reconciler must run
the (idempotent) operation again, or undo it, before trusting it.

Unique volume names follow the kubelet: ``<plugin>/<volume name>`` for volumes the plugin
attaches or device-mounts (so every pod shares one device mount), and
``<plugin>/<pod uid>-<spec name>`` otherwise (each pod has its own).

Both stores are thread-safe; their queries return frozen snapshots.
"""

from __future__ import annotations

import collections
import enum
import threading
from collections.abc import Iterable

import attrs

from kubevol.errors import SpecError
from kubevol.k8s.pod import Pod
from kubevol.manager import PluginRoles
from kubevol.spec import Spec


class VolumeMode(enum.StrEnum):
    """How a pod consumes the volume (a PersistentVolume's ``volumeMode``)."""

    FILESYSTEM = "Filesystem"
    BLOCK = "Block"


class MountState(enum.StrEnum):
    """Whether something is mounted (attached, set up, mapped)."""

    MOUNTED = "mounted"
    UNCERTAIN = "uncertain"
    UNMOUNTED = "unmounted"


def unique_volume_name(
    plugin_name: str, volume_name: str, *, shared: bool, pod_uid: str, spec_name: str
) -> str:
    """The kubelet's unique volume name (see the module docstring)."""
    if shared:
        return f"{plugin_name}/{volume_name}"
    return f"{plugin_name}/{pod_uid}-{spec_name}"


@attrs.frozen(kw_only=True)
class VolumeIdentity:
    """How the node names a volume and where its device is mounted, as its plugin says."""

    unique_name: str
    volume_name: str
    attachable: bool
    device_mountable: bool
    #: The device (staging) mount path of a filesystem volume the plugin device-mounts,
    #: else ``""`` (a block volume's global map path is learnt from its mapper).
    device_mount_path: str


def volume_identity(
    roles: PluginRoles, spec: Spec, *, pod_uid: str, spec_name: str, mode: VolumeMode
) -> VolumeIdentity:
    """The identity of ``spec`` in pod ``pod_uid`` (volume directory ``spec_name``), from the
    roles its plugin plays for it (:meth:`~kubevol.manager.PluginRoles.for_spec`): one
    unique name for every pod when the volume is attached or device-mounted, one per pod
    otherwise. Raises what the plugin raises about the Spec."""
    device, attachable = roles.device_mountable, roles.attachable is not None
    shared = device is not None or attachable
    try:
        volume_name = roles.plugin.get_volume_name(spec)
    except SpecError:
        if shared:
            raise
        # A volume neither attached nor device-mounted is known by pod and spec
        # (GetUniqueVolumeNameFromSpecWithPod); the kubelet never asks its plugin for a
        # name, and an inline CSI volume has none (its handle is made from the pod's UID).
        volume_name = spec_name
    device_mount_path = ""
    if mode is VolumeMode.FILESYSTEM and device is not None:
        device_mount_path = device.new_device_mounter().get_device_mount_path(spec)
    return VolumeIdentity(
        unique_name=unique_volume_name(
            roles.name, volume_name, shared=shared, pod_uid=pod_uid,
            spec_name=spec_name,
        ),
        volume_name=volume_name,
        attachable=attachable,
        device_mountable=device is not None,
        device_mount_path=device_mount_path,
    )


@attrs.frozen(kw_only=True)
class VolumeToMount:
    """One volume one pod needs: what the reconciler must make true.

    ``pod`` is the ``V1Pod``; ``outer_name`` the name in the pod's ``volumes`` list;
    ``spec.name()`` (the PersistentVolume's name for claims) names the pod's volume
    directory. ``attachable``/``device_mountable`` say what the plugin does for it.
    ``size`` is the size asked for (bytes), when known; ``claim_size`` the size the claim's
    status reports (the size the volume had when last expanded: smaller than ``size`` after
    an expansion the node has not finished yet). ``sub_path``: a container of the pod
    mounts a subPath of it (a step after the mount, which a crash may cut short).
    """

    unique_name: str
    volume_name: str
    plugin_name: str
    pod_uid: str
    pod: Pod
    outer_name: str
    spec: Spec
    mode: VolumeMode = VolumeMode.FILESYSTEM
    attachable: bool = False
    device_mountable: bool = False
    device_mount_path: str = ""
    fs_group: int | None = None
    size: int | None = None
    claim_size: int | None = None
    sub_path: bool = False

    @property
    def spec_name(self) -> str:
        """The name of the pod's directory for this volume."""
        return self.spec.name()


@attrs.frozen(kw_only=True)
class DesiredPod:
    """A pod that should run on the node, with the volumes it needs."""

    uid: str
    pod: Pod
    volumes: tuple[VolumeToMount, ...]

    @property
    def name(self) -> str:
        """``namespace/name`` of the pod, or its UID when it has no name."""
        meta = getattr(self.pod, "metadata", None)
        name = getattr(meta, "name", None)
        if not name:
            return self.uid
        return f"{getattr(meta, 'namespace', None) or 'default'}/{name}"


class DesiredState:
    """Pods that should run, and their volumes. Thread-safe."""

    def __init__(self) -> None:
        self._pods: dict[str, DesiredPod] = {}
        #: How many desired pods want each volume (by unique name): :meth:`is_desired`
        #: without a look at every pod.
        self._wanting: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def set_pod(self, pod: DesiredPod) -> None:
        """Add ``pod`` or replace what was desired for its UID."""
        with self._lock:
            self._forget(self._pods.get(pod.uid))
            self._pods[pod.uid] = pod
            self._wanting.update({v.unique_name for v in pod.volumes})

    def remove_pod(self, uid: str) -> None:
        """Stop wanting pod ``uid``. Idempotent."""
        with self._lock:
            self._forget(self._pods.pop(uid, None))

    def _forget(self, pod: DesiredPod | None) -> None:
        for name in {v.unique_name for v in pod.volumes} if pod is not None else ():
            self._wanting[name] -= 1
            if self._wanting[name] <= 0:
                del self._wanting[name]

    def pods(self) -> list[DesiredPod]:
        """Every desired pod."""
        with self._lock:
            return list(self._pods.values())

    def pod(self, uid: str) -> DesiredPod | None:
        """The desired pod ``uid``, or None."""
        with self._lock:
            return self._pods.get(uid)

    def volumes_to_mount(self) -> list[VolumeToMount]:
        """Every (volume, pod) pair that should be set up."""
        with self._lock:
            return [v for p in self._pods.values() for v in p.volumes]

    def is_desired(self, unique_name: str, pod_uid: str | None = None) -> bool:
        """Whether any pod (or pod ``pod_uid``) wants the volume."""
        with self._lock:
            if pod_uid is None:
                return unique_name in self._wanting
            pod = self._pods.get(pod_uid)
            return pod is not None and any(v.unique_name == unique_name for v in pod.volumes)


@attrs.frozen(kw_only=True)
class MountedVolume:
    """One pod's use of a volume, as the actual state knows it."""

    unique_name: str
    pod_uid: str
    spec_name: str
    outer_name: str
    state: MountState
    path: str
    reconstructed: bool = False


@attrs.frozen(kw_only=True)
class AttachedVolume:
    """A volume present on the node (attached or not needing it), with its device mount."""

    unique_name: str
    volume_name: str
    plugin_name: str
    spec: Spec
    mode: VolumeMode
    attachable: bool
    device_mountable: bool
    attach_state: MountState
    device_path: str
    device_mount_path: str
    device_state: MountState
    size: int | None
    pods: tuple[MountedVolume, ...]
    reconstructed: bool = False


@attrs.define
class _PodEntry:
    spec_name: str
    outer_name: str
    state: MountState
    path: str
    reconstructed: bool


@attrs.define
class _VolumeEntry:
    unique_name: str
    volume_name: str
    plugin_name: str
    spec: Spec
    mode: VolumeMode
    attachable: bool
    device_mountable: bool
    attach_state: MountState = MountState.UNMOUNTED
    device_path: str = ""
    device_mount_path: str = ""
    device_state: MountState = MountState.UNMOUNTED
    size: int | None = None
    reconstructed: bool = False
    pods: dict[str, _PodEntry] = attrs.field(factory=dict)
    #: The last snapshot, until the entry changes (:meth:`changed`): a reconciler pass
    #: reads every volume, and building a thousand frozen snapshots per pass cost more
    #: than the pass's own work (while holding the state's lock, so operations waited).
    _snapshot: AttachedVolume | None = attrs.field(default=None, init=False, repr=False, eq=False)

    def changed(self) -> _VolumeEntry:
        """Drop the kept snapshot (call before changing the entry); returns the entry."""
        self._snapshot = None
        return self

    def snapshot(self) -> AttachedVolume:
        if self._snapshot is None:
            self._snapshot = self._build_snapshot()
        return self._snapshot

    def _build_snapshot(self) -> AttachedVolume:
        return AttachedVolume(
            unique_name=self.unique_name,
            volume_name=self.volume_name,
            plugin_name=self.plugin_name,
            spec=self.spec,
            mode=self.mode,
            attachable=self.attachable,
            device_mountable=self.device_mountable,
            attach_state=self.attach_state,
            device_path=self.device_path,
            device_mount_path=self.device_mount_path,
            device_state=self.device_state,
            size=self.size,
            reconstructed=self.reconstructed,
            pods=tuple(
                MountedVolume(
                    unique_name=self.unique_name,
                    pod_uid=uid,
                    spec_name=p.spec_name,
                    outer_name=p.outer_name,
                    state=p.state,
                    path=p.path,
                    reconstructed=p.reconstructed,
                )
                for uid, p in sorted(self.pods.items())
            ),
        )


class ActualState:
    """What is attached, device-mounted and set up on the node. Thread-safe.

    A volume enters with :meth:`add_volume` and leaves with :meth:`remove_volume` once
    nothing of it is left (no pod, device unmounted, detached).
    """

    def __init__(self) -> None:
        self._volumes: dict[str, _VolumeEntry] = {}
        #: How many volumes each pod uses: which pods use any is asked in every pass while
        #: a pod goes, and counting the entries' pods each time costs what every pod has.
        self._uses: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def _used(self, pod_uid: str, by: int) -> None:
        """Count ``by`` more (or fewer) of the pod's uses; a pod at zero is forgotten."""
        self._uses[pod_uid] += by
        if self._uses[pod_uid] <= 0:
            del self._uses[pod_uid]

    def add_volume(
        self,
        *,
        unique_name: str,
        volume_name: str,
        plugin_name: str,
        spec: Spec,
        mode: VolumeMode,
        attachable: bool,
        device_mountable: bool,
        device_mount_path: str = "",
        reconstructed: bool = False,
    ) -> None:
        """Record a volume (not yet attached); keeps what is known if it is there already."""
        with self._lock:
            entry = self._volumes.get(unique_name)
            if entry is None:
                self._volumes[unique_name] = _VolumeEntry(
                    unique_name=unique_name,
                    volume_name=volume_name,
                    plugin_name=plugin_name,
                    spec=spec,
                    mode=mode,
                    attachable=attachable,
                    device_mountable=device_mountable,
                    device_mount_path=device_mount_path,
                    reconstructed=reconstructed,
                )
            elif entry.reconstructed and not reconstructed:
                # The desired state knows the volume better than what was read from disk.
                entry.changed().spec = spec
                entry.reconstructed = False

    def _entry(self, unique_name: str) -> _VolumeEntry:
        """The entry of a volume about to change (its kept snapshot dropped)."""
        entry = self._volumes.get(unique_name)
        if entry is None:
            raise KeyError(f"volume {unique_name!r} is not in the actual state")
        return entry.changed()

    def set_attach_state(self, unique_name: str, state: MountState, device_path: str = "") -> None:
        """Mark the volume attached (with its device path), uncertain or detached."""
        with self._lock:
            entry = self._entry(unique_name)
            entry.attach_state = state
            if device_path:
                entry.device_path = device_path

    def set_device_state(
        self, unique_name: str, state: MountState, device_mount_path: str = ""
    ) -> None:
        """Mark the device mounted (at ``device_mount_path``), uncertain or unmounted."""
        with self._lock:
            entry = self._entry(unique_name)
            entry.device_state = state
            if device_mount_path:
                entry.device_mount_path = device_mount_path

    def set_size(self, unique_name: str, size: int | None) -> None:
        """Record the size the volume has on the node (after set-up or expansion)."""
        with self._lock:
            self._entry(unique_name).size = size

    def set_pod_state(
        self,
        unique_name: str,
        pod_uid: str,
        state: MountState,
        *,
        spec_name: str = "",
        outer_name: str = "",
        path: str = "",
        reconstructed: bool = False,
    ) -> None:
        """Mark pod ``pod_uid``'s use of the volume; UNMOUNTED forgets the pod."""
        with self._lock:
            entry = self._entry(unique_name)
            if state is MountState.UNMOUNTED:
                if entry.pods.pop(pod_uid, None) is not None:
                    self._used(pod_uid, -1)
                return
            pod = entry.pods.get(pod_uid)
            if pod is None:
                self._used(pod_uid, 1)
                entry.pods[pod_uid] = _PodEntry(
                    spec_name=spec_name,
                    outer_name=outer_name or spec_name,
                    state=state,
                    path=path,
                    reconstructed=reconstructed,
                )
                return
            pod.state = state
            if outer_name and not reconstructed:
                pod.outer_name = outer_name
                pod.reconstructed = False
            if path:
                pod.path = path

    def remove_volume(self, unique_name: str) -> None:
        """Forget the volume. Idempotent."""
        with self._lock:
            entry = self._volumes.pop(unique_name, None)
            for uid in entry.pods if entry is not None else ():
                self._used(uid, -1)

    def volume(self, unique_name: str) -> AttachedVolume | None:
        """The volume's snapshot, or None."""
        with self._lock:
            entry = self._volumes.get(unique_name)
            return entry.snapshot() if entry is not None else None

    def volumes(self) -> list[AttachedVolume]:
        """Every volume, sorted by unique name."""
        with self._lock:
            return [self._volumes[k].snapshot() for k in sorted(self._volumes)]

    def pod_volume(self, unique_name: str, pod_uid: str) -> MountedVolume | None:
        """Pod ``pod_uid``'s use of the volume, or None."""
        volume = self.volume(unique_name)
        if volume is None:
            return None
        return next((p for p in volume.pods if p.pod_uid == pod_uid), None)

    def mounted_volumes(self) -> list[MountedVolume]:
        """Every pod's use of every volume."""
        return [p for v in self.volumes() for p in v.pods]

    def pods(self) -> set[str]:
        """UIDs of the pods using any volume."""
        with self._lock:
            return set(self._uses)

    def clear(self) -> None:
        """Forget everything (what a crash does to memory)."""
        with self._lock:
            self._volumes.clear()
            self._uses.clear()

    def merge(self, volumes: Iterable[AttachedVolume]) -> None:
        """Add what ``volumes`` (snapshots, e.g. from reconstruction) know and this state
        does not: unknown volumes whole, and unknown pods of known volumes."""
        with self._lock:
            for v in volumes:
                entry = self._volumes.get(v.unique_name)
                if entry is None:
                    entry = _VolumeEntry(
                        unique_name=v.unique_name,
                        volume_name=v.volume_name,
                        plugin_name=v.plugin_name,
                        spec=v.spec,
                        mode=v.mode,
                        attachable=v.attachable,
                        device_mountable=v.device_mountable,
                        attach_state=v.attach_state,
                        device_path=v.device_path,
                        device_mount_path=v.device_mount_path,
                        device_state=v.device_state,
                        size=v.size,
                        reconstructed=v.reconstructed,
                    )
                    self._volumes[v.unique_name] = entry
                entry.changed()
                for p in v.pods:
                    if p.pod_uid not in entry.pods:
                        self._used(p.pod_uid, 1)
                    entry.pods.setdefault(
                        p.pod_uid,
                        _PodEntry(
                            spec_name=p.spec_name,
                            outer_name=p.outer_name,
                            state=p.state,
                            path=p.path,
                            reconstructed=p.reconstructed,
                        ),
                    )
