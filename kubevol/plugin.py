"""The plugin bases (Kubernetes' ``VolumePlugin`` and its capability interfaces).

A plugin subclasses :class:`VolumePlugin` and every capability base it offers; the
manager finds capabilities with ``isinstance``. ``init`` is called exactly once, before
any ``new_*`` call.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from kubevol.k8s.pod import Pod
from kubevol.layout import PodVolumeEntry
from kubevol.mount.guard import UnmountVerdict, kubelet_refs_verdict
from kubevol.mount.table import MountTable
from kubevol.types import NodeResizeOptions, ReconstructedVolume, VolumeOptions
from kubevol.volume import (
    Attacher,
    BlockVolumeMapper,
    BlockVolumeUnmapper,
    Deleter,
    Detacher,
    DeviceMounter,
    DeviceUnmounter,
    Mounter,
    Provisioner,
    Unmounter,
)

if TYPE_CHECKING:
    from kubevol.host import VolumeHost
    from kubevol.spec import Spec

#: Receives (event type, message) pairs, e.g. ``("Normal", "recycled volume pv-1")``.
EventRecorder = Callable[[str, str], None]


class VolumePlugin(abc.ABC):
    """A kind of volume a node can set up for pods."""

    def init(self, host: VolumeHost) -> None:  # noqa: B027 - optional hook with a default
        """Called once by the manager before any ``new_*`` call; raise to refuse the plugin."""

    @abc.abstractmethod
    def get_plugin_name(self) -> str:
        """The plugin's qualified name, e.g. ``kubernetes.io/empty-dir`` (at most one ``/``)."""

    @abc.abstractmethod
    def get_volume_name(self, spec: Spec) -> str:
        """A name unique to the backing storage of ``spec``; raises if ``spec`` is unsupported."""

    @abc.abstractmethod
    def can_support(self, spec: Spec) -> bool:
        """Whether this plugin handles ``spec``. Must not raise."""

    def requires_remount(self, spec: Spec) -> bool:
        """Whether ``set_up`` must run again periodically (atomically updated volumes)."""
        return False

    @abc.abstractmethod
    def new_mounter(self, spec: Spec, pod: Pod, opts: VolumeOptions) -> Mounter:
        """A mounter for ``spec`` in ``pod`` (a ``kubernetes.client.V1Pod``)."""

    @abc.abstractmethod
    def new_unmounter(self, volume_name: str, pod_uid: str) -> Unmounter:
        """An unmounter for a volume of a pod, from what is known after a restart."""

    @abc.abstractmethod
    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        """Rebuild a Spec from what is on disk at ``volume_path`` (used by reconstruction).

        Raises a clear error, never a guess, when the disk does not say enough.
        """

    def supports_mount_option(self) -> bool:
        """Whether user-given mount options are honoured."""
        return False

    def supports_bulk_volume_verification(self) -> bool:
        """Whether :class:`BulkVolumeVerifier` is implemented efficiently."""
        return False

    def supports_selinux_context_mount(self, spec: Spec) -> bool:
        """Whether the volume can be mounted with an SELinux ``context=`` option."""
        return False

    def pod_volume_entry(self, name: str) -> PodVolumeEntry:
        """What the entry ``name`` directly inside one of this plugin's pod volume
        directories is: the plugin's own metadata, the directory it mounts the volume at, or
        pod data. Asked when a tear-down was interrupted, to finish it without ever removing
        pod data. Default: everything is pod data (nothing is removed but empty directories).
        """
        return PodVolumeEntry.DATA


class PersistentVolumePlugin(VolumePlugin):
    """A plugin for long-lived volumes (PersistentVolumes)."""

    @abc.abstractmethod
    def get_access_modes(self) -> list[str]:
        """The access modes the plugin supports (``ReadWriteOnce``, ...)."""


class RecyclableVolumePlugin(VolumePlugin):
    """A plugin that can scrub a released volume for reuse."""

    @abc.abstractmethod
    def recycle(self, pv_name: str, spec: Spec, event_recorder: EventRecorder | None) -> None:
        """Empty the volume so a new claim can use it; blocks until done."""


class DeletableVolumePlugin(VolumePlugin):
    """A plugin that can delete a released volume's storage."""

    @abc.abstractmethod
    def new_deleter(self, spec: Spec) -> Deleter:
        """A deleter for the storage behind ``spec``."""


class ProvisionableVolumePlugin(VolumePlugin):
    """A plugin that can create storage for new PersistentVolumes."""

    @abc.abstractmethod
    def new_provisioner(self, options: VolumeOptions) -> Provisioner:
        """A provisioner for a volume described by ``options``."""


class DeviceMountableVolumePlugin(VolumePlugin):
    """A plugin that mounts a device once per node before pods bind it (staging)."""

    @abc.abstractmethod
    def new_device_mounter(self) -> DeviceMounter:
        """A device mounter."""

    @abc.abstractmethod
    def new_device_unmounter(self) -> DeviceUnmounter:
        """A device unmounter."""

    @abc.abstractmethod
    def get_device_mount_refs(self, device_mount_path: str) -> list[str]:
        """The other mount points of what is mounted at ``device_mount_path`` (Kubernetes'
        ``GetMountRefs``: the same filesystem root and device), whether they block its
        unmount or not: :meth:`device_unmount_verdict` decides that."""

    def device_unmount_verdict(
        self, device_mount_path: str, *, table: MountTable | None = None
    ) -> UnmountVerdict:
        """May ``device_mount_path`` be unmounted now? The ONE unstage check: the node layer
        asks it once and hands the verdict to ``unmount_device``. ``table`` is the mount
        table the caller read for this operation (its other checks use the same one); None
        reads the current one. A plugin may ignore it and look itself. The table lists
        every mount present, but may still list some detached since it was read
        (:meth:`MountTableCache.table <kubevol.mount.table.MountTableCache.table>`): a
        verdict must only refuse on what it finds there, and a refusal is asked again on
        a fresh table.

        Default: the kubelet's ``HasMountRefs`` rule on :meth:`get_device_mount_refs`
        (:func:`~kubevol.mount.guard.kubelet_refs_verdict`). A plugin with its own policy
        (the CSI plugin's unstage guard) overrides it. Raises what the reference lookup
        raises (:class:`~kubevol.errors.MountError` when the mount table cannot be read).
        """
        return kubelet_refs_verdict(
            device_mount_path, self.get_device_mount_refs(device_mount_path)
        )

    def can_device_mount(self, spec: Spec) -> bool:
        """Whether ``spec`` needs a device mount."""
        return True


class AttachableVolumePlugin(DeviceMountableVolumePlugin):
    """A plugin whose volumes are attached to a node before they are mounted."""

    @abc.abstractmethod
    def new_attacher(self) -> Attacher:
        """An attacher."""

    @abc.abstractmethod
    def new_detacher(self) -> Detacher:
        """A detacher."""

    def can_attach(self, spec: Spec) -> bool:
        """Whether ``spec`` needs attaching."""
        return True


class ExpandableVolumePlugin(VolumePlugin):
    """A plugin whose volumes can be grown by the control plane."""

    @abc.abstractmethod
    def expand_volume_device(self, spec: Spec, new_size: int, old_size: int) -> int:
        """Grow the storage to ``new_size`` bytes; returns the size reached."""

    @abc.abstractmethod
    def requires_fs_resize(self) -> bool:
        """Whether the filesystem must then be grown on the node."""


class NodeExpandableVolumePlugin(VolumePlugin):
    """A plugin whose volumes are grown on the node."""

    @abc.abstractmethod
    def requires_fs_resize(self) -> bool:
        """Whether a node-side resize is needed at all."""

    @abc.abstractmethod
    def node_expand(self, options: NodeResizeOptions) -> bool:
        """Grow the volume on the node; True when the resize is complete."""


class BlockVolumePlugin(VolumePlugin):
    """A plugin that maps raw block devices into pods."""

    @abc.abstractmethod
    def new_block_volume_mapper(
        self, spec: Spec, pod: Pod, opts: VolumeOptions
    ) -> BlockVolumeMapper:
        """A mapper for ``spec`` in ``pod``."""

    @abc.abstractmethod
    def new_block_volume_unmapper(self, volume_name: str, pod_uid: str) -> BlockVolumeUnmapper:
        """An unmapper for a pod's block volume, from what is known after a restart."""

    @abc.abstractmethod
    def construct_block_volume_spec(self, pod_uid: str, volume_name: str, volume_path: str) -> Spec:
        """Rebuild a block volume's Spec from disk; raises a clear error when it cannot."""


class VolumePluginWithAttachLimits(VolumePlugin):
    """A plugin with a limit on how many of its volumes a node can attach."""

    @abc.abstractmethod
    def get_volume_limits(self) -> dict[str, int]:
        """Limits keyed by ``volume_limit_key`` (CSI: ``attachable-volumes-csi-<driver>``)."""

    @abc.abstractmethod
    def volume_limit_key(self, spec: Spec) -> str:
        """The node-allocatable key counting ``spec``'s volumes, e.g.
        ``attachable-volumes-csi-<driver>`` (shortened with a hash when too long)."""


class BulkVolumeVerifier(abc.ABC):
    """Checks in one call which volumes are still attached to which nodes."""

    @abc.abstractmethod
    def bulk_verify_volumes(
        self, volumes_by_node: Mapping[str, Sequence[Spec]]
    ) -> dict[str, dict[Spec, bool]]:
        """For each node, which of its volumes are attached. On error assume all are."""


class ProbeOperation(enum.IntEnum):
    """What a dynamic prober reports about a plugin (Kubernetes' values)."""

    ADD_OR_UPDATE = 2
    REMOVE = 4


@attrs.frozen(kw_only=True)
class ProbeEvent:
    """A plugin added, updated or removed by a dynamic prober (``plugin`` is None on removal)."""

    plugin: VolumePlugin | None
    plugin_name: str
    op: ProbeOperation


class DynamicPluginProber(abc.ABC):
    """Discovers plugins at run time (like the kubelet's FlexVolume prober)."""

    def init(self) -> None:  # noqa: B027 - optional hook with a default
        """Prepare probing; a failure makes the manager run without this prober."""

    @abc.abstractmethod
    def probe(self) -> list[ProbeEvent]:
        """Events since the last call.

        To report a failure and still deliver the events found before it, raise
        :class:`~kubevol.errors.ProbeError` with them: the manager applies them and logs
        the error, as the kubelet does.
        """
