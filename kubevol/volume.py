"""The volume-level bases: what a plugin hands out to mount, attach, map and measure a volume.

These mirror Kubernetes' ``pkg/volume/volume.go``. Each method's docstring states its
contract. Unless it says otherwise, an operation may raise
:class:`~kubevol.errors.TransientOperationError` (nothing changed, retry later),
:class:`~kubevol.errors.UncertainProgressError` (it may have happened, retry) or any
other error, which is final.
"""

from __future__ import annotations

import abc
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from kubevol.k8s.pod import Pod
from kubevol.types import Attributes, DeviceMounterArgs, MounterArgs

if TYPE_CHECKING:
    from kubernetes.client import V1Node, V1PersistentVolume, V1TopologySelectorTerm

    from kubevol.mount.guard import UnmountVerdict
    from kubevol.mount.probe import Pending
    from kubevol.spec import Spec


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@attrs.frozen(kw_only=True)
class Metrics:
    """A volume's usage. Bytes and counts are ints; ``None`` means unknown.

    For volumes that share a filesystem with the host (emptyDir, hostPath) ``capacity``,
    ``available``, ``inodes`` and ``inodes_free`` describe that shared filesystem, so
    ``used + available`` need not equal ``capacity``. ``abnormal`` and ``message`` carry
    a volume condition reported by a CSI driver.
    """

    time: datetime.datetime = attrs.field(factory=_utc_now)
    used: int | None = None
    capacity: int | None = None
    available: int | None = None
    inodes_used: int | None = None
    inodes: int | None = None
    inodes_free: int | None = None
    abnormal: bool | None = None
    message: str | None = None


class MetricsProvider(abc.ABC):
    """Reports a volume's usage."""

    @abc.abstractmethod
    def get_metrics(self) -> Metrics:
        """Measure now; may be expensive. Raises :class:`~kubevol.errors.MetricsError`."""

    def metrics_starter(self) -> Callable[[], Pending[Metrics]] | None:
        """What starts :meth:`get_metrics` without waiting for its answer, for a caller that
        measures many volumes at once (:meth:`kubevol.mount.probe.PathProbe.wait_each`),
        where the provider can start one without blocking: a CSI driver's
        NodeGetVolumeStats. None (the default) otherwise; the caller then calls
        :meth:`get_metrics`."""
        return None


class Volume(MetricsProvider):
    """A directory used by a pod or the host. Every method is idempotent."""

    @abc.abstractmethod
    def get_path(self) -> str:
        """The path at which the volume is (or will be) mounted for the pod."""


class Mounter(Volume):
    """Sets up (mounts, populates) a volume for one pod."""

    @abc.abstractmethod
    def can_mount(self) -> None:
        """Raise if the node lacks what ``set_up`` needs (binaries, kernel modules)."""

    def set_up(self, args: MounterArgs) -> None:
        """Set the volume up at :meth:`get_path`. Idempotent; see :meth:`set_up_at`."""
        self.set_up_at(self.get_path(), args)

    @abc.abstractmethod
    def set_up_at(self, directory: str, args: MounterArgs) -> None:
        """Set the volume up at ``directory``, which may not exist yet.

        Idempotent: called again on a volume already set up, it succeeds without
        changing it. Ownership follows ``args.fs_group``/``args.fs_user``. Raises
        transient, uncertain or final errors as the module says.
        """

    @abc.abstractmethod
    def get_attributes(self) -> Attributes:
        """What the set-up volume is like; called after :meth:`set_up_at`."""


class Unmounter(Volume):
    """Tears down what a :class:`Mounter` set up."""

    def tear_down(self) -> None:
        """Tear down the volume at :meth:`get_path`; see :meth:`tear_down_at`."""
        self.tear_down_at(self.get_path())

    @abc.abstractmethod
    def tear_down_at(self, directory: str) -> None:
        """Unmount ``directory`` and remove the traces of set-up.

        Idempotent: a directory that is already gone is success. A failed unmount never
        deletes the volume's data.
        """


class DeviceMounter(abc.ABC):
    """Mounts a device once per node at a global path that pods' mounts then bind."""

    @abc.abstractmethod
    def get_device_mount_path(self, spec: Spec) -> str:
        """The global (staging) path for the volume's device."""

    @abc.abstractmethod
    def mount_device(
        self,
        spec: Spec,
        device_path: str,
        device_mount_path: str,
        args: DeviceMounterArgs,
    ) -> None:
        """Mount the device at ``device_mount_path``. Idempotent.

        ``device_path`` is empty for plugins that do not attach. Raises transient,
        uncertain or final errors.
        """


class DeviceUnmounter(abc.ABC):
    """Unmounts the global device mount."""

    @abc.abstractmethod
    def unmount_device(
        self, device_mount_path: str, *, verdict: UnmountVerdict | None = None
    ) -> None:
        """Unmount the global mount; called only once no pod bind-mounts it. Idempotent.

        ``verdict`` is the plugin's ``device_unmount_verdict`` for this path, already
        obtained (and found allowing) by the caller: an unmounter that guards the unstage
        itself uses it instead of checking again. Without it, such an unmounter checks.
        """


class Attacher(DeviceMounter):
    """Attaches a volume to a node, then mounts its device."""

    @abc.abstractmethod
    def attach(self, spec: Spec, node_name: str) -> str:
        """Attach the volume to ``node_name``; returns the device path there. Idempotent."""

    @abc.abstractmethod
    def volumes_are_attached(self, specs: Sequence[Spec], node_name: str) -> dict[Spec, bool]:
        """Which of ``specs`` are still attached to ``node_name``."""

    @abc.abstractmethod
    def wait_for_attach(
        self, spec: Spec, device_path: str, pod: Pod, timeout: datetime.timedelta
    ) -> str:
        """Block until the device is attached to this node; return its path or raise on timeout."""


class Detacher(DeviceUnmounter):
    """Detaches a volume from a node."""

    @abc.abstractmethod
    def detach(self, volume_name: str, node_name: str) -> None:
        """Detach ``volume_name`` (as from ``get_volume_name``) from ``node_name``. Idempotent."""

    def detaches(self, volume_name: str, *, ask: bool = True) -> bool:
        """Whether :meth:`detach` of ``volume_name`` does anything on this node. False: the
        volume was never really attached (the kubelet's non-attachable volumes), so the node
        only forgets it and needs no check that pods are done with it, and its attach did
        nothing either. True unless the plugin knows better. ``ask=False``: from what the
        plugin knows already, without calling anyone (True when that does not tell), for
        callers that must not wait on a driver."""
        return True


class BlockVolume(abc.ABC):
    """Paths of a raw block volume."""

    @abc.abstractmethod
    def get_global_map_path(self, spec: Spec) -> str:
        """The node-wide directory that holds the device's bind mounts."""

    @abc.abstractmethod
    def get_pod_device_map_path(self) -> tuple[str, str]:
        """The pod's ``volumeDevices`` directory and the name of the device link in it."""


class BlockVolumeMapper(BlockVolume):
    """Maps a block volume into a pod."""


class BlockVolumeUnmapper(BlockVolume):
    """Unmaps a block volume from a pod."""


class CustomBlockVolumeMapper(BlockVolumeMapper):
    """A mapper that stages and publishes the device itself (as CSI does)."""

    @abc.abstractmethod
    def set_up_device(self) -> str:
        """Prepare the device on the node; returns the staging path. Idempotent."""

    @abc.abstractmethod
    def map_pod_device(self) -> str:
        """Map the device for the pod; returns the publish path (``""``: the attacher's path)."""

    @abc.abstractmethod
    def get_staging_path(self) -> str:
        """The path :meth:`set_up_device` staged the device at."""


class CustomBlockVolumeUnmapper(BlockVolumeUnmapper):
    """Undoes what a :class:`CustomBlockVolumeMapper` did."""

    @abc.abstractmethod
    def tear_down_device(self, map_path: str, device_path: str) -> None:
        """Undo :meth:`CustomBlockVolumeMapper.set_up_device`. Idempotent."""

    @abc.abstractmethod
    def unmap_pod_device(self) -> None:
        """Undo :meth:`CustomBlockVolumeMapper.map_pod_device`. Idempotent."""


class Provisioner(abc.ABC):
    """Creates the storage behind a new PersistentVolume."""

    @abc.abstractmethod
    def provision(
        self,
        selected_node: V1Node | None = None,
        allowed_topologies: Sequence[V1TopologySelectorTerm] = (),
    ) -> V1PersistentVolume:
        """Create the storage; returns the ``V1PersistentVolume`` describing it. Blocks."""


class Deleter(Volume):
    """Deletes the storage of a released PersistentVolume."""

    @abc.abstractmethod
    def delete(self) -> None:
        """Delete the storage; blocks until done. Raises if it was not deleted."""


#: The shape of the result of ``Attacher.volumes_are_attached`` and bulk verification.
AttachedByNode = Mapping[str, Mapping["Spec", bool]]
