"""``CSIPlugin``: the kubelet's ``kubernetes.io/csi`` volume plugin, driving any CSI driver.

One instance serves every CSI driver registered in its :class:`DriverRegistry`. What the
plugin needs to know about a driver beyond its socket (attach required? pod info?
fsGroup policy? ephemeral allowed?) comes from ONE lookup ``name -> V1CSIDriver | None``:
the one given to the constructor, else the host's ``get_csi_driver`` (see
:mod:`kubevol.plugins.csi.driverinfo`). Attachment goes through an
:class:`~kubevol.plugins.csi.attach.AttachBackend`: VolumeAttachments when the host has a
Kubernetes client, else the driver's own controller (direct).

Errors follow the kubelet: a driver that is not registered, a CSIDriver lookup, a
publish-context or secret lookup that fails are transient
(:class:`~kubevol.errors.TransientOperationError`); non-final stage/publish/expand
failures are uncertain; everything else is final.
"""

from __future__ import annotations

import logging
import os

from kubevol.host import VolumeHost
from kubevol.k8s.pod import Pod
from kubevol.layout import PodVolumeEntry, csi_pod_mount_path, csi_pod_volume_entry
from kubevol.mount.guard import GuardPolicy, UnmountVerdict
from kubevol.mount.table import MountTable
from kubevol.plugin import (
    AttachableVolumePlugin,
    BlockVolumePlugin,
    ExpandableVolumePlugin,
    NodeExpandableVolumePlugin,
    PersistentVolumePlugin,
    VolumePluginWithAttachLimits,
)
from kubevol.plugins.csi import paths
from kubevol.plugins.csi.attach import AttachBackend
from kubevol.plugins.csi.attacher import CSIAttacher
from kubevol.plugins.csi.block import CSIBlockMapper, new_block_mapper, new_block_unmapper
from kubevol.plugins.csi.context import CSI_TIMEOUT, CSIContext
from kubevol.plugins.csi.driverinfo import (
    LIFECYCLE_EPHEMERAL,
    LIFECYCLE_PERSISTENT,
    CSIDriverLookup,
)
from kubevol.plugins.csi.expander import expand_volume_device, node_expand
from kubevol.plugins.csi.mounter import CSIMounter
from kubevol.plugins.csi.recovery import volume_data_from_mounts
from kubevol.plugins.csi.registration.registry import DriverRegistry
from kubevol.plugins.csi.rules import attach_limit_key
from kubevol.plugins.csi.source import (
    READ_ONLY_MANY,
    READ_WRITE_MANY,
    READ_WRITE_ONCE,
    READ_WRITE_ONCE_POD,
    CSIVolumeSource,
    is_csi_spec,
    reconstructed_spec,
)
from kubevol.plugins.csi.voldata import (
    KEY_DRIVER_NAME,
    KEY_LIFECYCLE_MODE,
    KEY_SELINUX_MOUNT_CONTEXT,
    KEY_SPEC_VOL_ID,
    KEY_VOLUME_HANDLE,
    VolumeDataError,
    load_volume_data,
    require,
    with_context,
)
from kubevol.spec import Spec, pod_uid
from kubevol.types import NodeResizeOptions, ReconstructedVolume, VolumeOptions
from kubevol.util.deadline import Deadline

log = logging.getLogger(__name__)

CSI_PLUGIN_NAME = paths.CSI_PLUGIN_NAME

__all__ = ["CSI_PLUGIN_NAME", "CSI_TIMEOUT", "CSIPlugin"]


class CSIPlugin(
    PersistentVolumePlugin,
    AttachableVolumePlugin,
    BlockVolumePlugin,
    ExpandableVolumePlugin,
    NodeExpandableVolumePlugin,
    VolumePluginWithAttachLimits,
):
    """The ``kubernetes.io/csi`` plugin.

    ``registry`` holds the registered drivers (a new one by default: register drivers in
    :attr:`registry` or let a :class:`~kubevol.plugins.csi.registration.PluginWatcher` do it).
    ``csi_drivers`` is the CSIDriver lookup (default: the host's ``get_csi_driver``).
    ``attach_backend`` defaults to VolumeAttachments when the host has a Kubernetes client,
    else to direct ControllerPublish. ``guard_policy`` picks the unstage guard's rules
    (``safe`` or ``kubelet``). ``timeout`` bounds each CSI call; ``attach_timeout`` the
    wait for an attachment; ``deadline`` (a command's) caps both with the time it has left.

    The roles it builds (attacher, mounter, block mapper, expander, metrics) share
    :attr:`context`, a :class:`~kubevol.plugins.csi.context.CSIContext`, and never call
    back into the plugin.
    """

    def __init__(
        self,
        *,
        registry: DriverRegistry | None = None,
        csi_drivers: CSIDriverLookup | None = None,
        attach_backend: AttachBackend | None = None,
        guard_policy: GuardPolicy | str = GuardPolicy.SAFE,
        timeout: float = CSI_TIMEOUT,
        attach_timeout: float = CSI_TIMEOUT,
        deadline: Deadline | None = None,
    ) -> None:
        self.context = CSIContext(
            registry=registry if registry is not None else DriverRegistry(),
            csi_drivers=csi_drivers,
            attach_backend=attach_backend,
            guard_policy=GuardPolicy(guard_policy),
            timeout=timeout,
            attach_timeout=attach_timeout,
            deadline=deadline,
        )

    # --- set-up ---------------------------------------------------------------------

    @property
    def registry(self) -> DriverRegistry:
        """The registered drivers."""
        return self.context.registry

    @property
    def guard_policy(self) -> GuardPolicy:
        """The unstage guard's rules; may be changed at any time."""
        return self.context.guard_policy

    @guard_policy.setter
    def guard_policy(self, policy: GuardPolicy | str) -> None:
        self.context.guard_policy = GuardPolicy(policy)

    @property
    def host(self) -> VolumeHost:
        """The host given to :meth:`init`."""
        return self.context.host

    @property
    def attach_backend(self) -> AttachBackend:
        """The attachment backend in use (chosen at :meth:`init` unless given)."""
        return self.context.attach_backend

    def init(self, host: VolumeHost) -> None:
        self.context.bind(host)

    def get_plugin_name(self) -> str:
        return CSI_PLUGIN_NAME

    def source(self, spec: Spec) -> CSIVolumeSource:
        """The CSI fields of ``spec``, read once per Spec (see :meth:`CSIContext.source`)."""
        return self.context.source(spec)

    def persistent_source(self, spec: Spec) -> CSIVolumeSource:
        """:meth:`source` for a CSI PersistentVolume only (see
        :meth:`CSIContext.persistent_source`)."""
        return self.context.persistent_source(spec)

    # --- VolumePlugin ---------------------------------------------------------------

    def get_volume_name(self, spec: Spec) -> str:
        source = self.persistent_source(spec)
        return paths.volume_name(source.driver, source.volume_handle)

    def can_support(self, spec: Spec) -> bool:
        return is_csi_spec(spec)

    def requires_remount(self, spec: Spec) -> bool:
        try:
            info = self.context.driver_info(self.source(spec).driver)
        except Exception as exc:
            log.warning("cannot tell whether %s requires republish: %s", spec.name(), exc)
            return False
        return info is not None and info.requires_republish

    def new_mounter(self, spec: Spec, pod: Pod, opts: VolumeOptions) -> CSIMounter:
        source = self.source(spec)
        uid = pod_uid(pod)
        handle = (
            paths.ephemeral_volume_handle(uid, spec.name()) if source.ephemeral
            else source.volume_handle
        )
        return CSIMounter(
            ctx=self.context,
            spec=spec,
            pod=pod,
            pod_uid=uid,
            spec_name=spec.name(),
            driver=source.driver,
            volume_handle=handle,
            lifecycle_mode=source.lifecycle_mode,
            read_only=source.read_only,
        )

    def new_unmounter(self, volume_name: str, pod_uid: str) -> CSIMounter:

        directory = paths.pod_volume_dir(self.host, pod_uid, volume_name)
        data = self._pod_volume_data(
            directory, f"unmounter failed to load volume data file [{directory}]",
            KEY_DRIVER_NAME, KEY_VOLUME_HANDLE,
        )
        driver, handle = data[KEY_DRIVER_NAME], data[KEY_VOLUME_HANDLE]
        return CSIMounter(
            ctx=self.context,
            spec=None,
            pod=None,
            pod_uid=pod_uid,
            spec_name=volume_name,
            driver=driver,
            volume_handle=handle,
            lifecycle_mode=data.get(KEY_LIFECYCLE_MODE, LIFECYCLE_PERSISTENT),
            read_only=False,
        )

    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        """Rebuild a Spec from ``<volume_path>/vol_data.json`` (``volume_path`` is the pod's
        ``.../kubernetes.io~csi/<volume>`` directory).

        Ephemeral volumes come back as an inline ``csi`` pod volume, persistent ones as a
        Filesystem PersistentVolume. Raises :class:`VolumeDataError` (a ValueError) when
        the file is missing, corrupt or lacks a key.
        """
        data = self._pod_volume_data(
            volume_path,
            f"plugin.ConstructVolumeSpec failed loading volume data using [{volume_path}]",
            KEY_SPEC_VOL_ID, KEY_DRIVER_NAME,
        )
        spec_name, driver = data[KEY_SPEC_VOL_ID], data[KEY_DRIVER_NAME]
        selinux = data.get(KEY_SELINUX_MOUNT_CONTEXT, "")
        if data.get(KEY_LIFECYCLE_MODE) == LIFECYCLE_EPHEMERAL:
            spec = reconstructed_spec(spec_name, driver, "", ephemeral=True)
            return ReconstructedVolume(spec=spec, selinux_mount_context=selinux)
        (handle,) = require(data, volume_path, KEY_VOLUME_HANDLE)
        return ReconstructedVolume(
            spec=reconstructed_spec(spec_name, driver, handle), selinux_mount_context=selinux
        )

    def _pod_volume_data(self, directory: str, context: str, *keys: str) -> dict[str, str]:
        """The pod volume's vol_data.json, with ``keys`` (the driver and handle always).

        It is the record of what to undo, and may be corrupt (truncated, empty, wrong
        types) or name another volume. When it cannot be read, or names a volume whose
        device mount is not on disk while the pod's target is mounted, the volume is taken
        from what the mount table and its device mount say (:mod:`.recovery`), so that it
        is unpublished and unstaged for real. Raises :class:`VolumeDataError` (prefixed by
        ``context``) when neither can tell.
        """
        keys = (*keys, KEY_DRIVER_NAME, KEY_VOLUME_HANDLE)
        try:
            data = load_volume_data(directory)
            require(data, directory, *keys)
        except VolumeDataError as exc:
            found = self._from_mounts(directory)
            if found is None:
                raise with_context(exc, context) from exc
            log.warning("%s: %s; taking %s^%s from the mount table and its device mount",
                        directory, exc, found[KEY_DRIVER_NAME], found[KEY_VOLUME_HANDLE])
            return found
        if self._device_dir_exists(data) or self._not_mounted(csi_pod_mount_path(directory)):
            return data  # the usual case: no mount table needed
        found = self._from_mounts(directory)
        if found is not None and (found[KEY_DRIVER_NAME], found[KEY_VOLUME_HANDLE]) != (
            data[KEY_DRIVER_NAME], data[KEY_VOLUME_HANDLE]
        ):
            log.warning("%s/vol_data.json names %s^%s, but its target shows %s^%s: taking the "
                        "mount table's", directory, data[KEY_DRIVER_NAME],
                        data[KEY_VOLUME_HANDLE], found[KEY_DRIVER_NAME],
                        found[KEY_VOLUME_HANDLE])
            return {**data, **found}
        return data

    def _not_mounted(self, target: str) -> bool:
        try:
            return self.host.get_mounter().is_likely_not_mount_point(target)
        except OSError:
            return True  # missing; or corrupted, where a NodeUnpublish is due all the same

    def _device_dir_exists(self, data: dict[str, str]) -> bool:
        try:
            device = paths.device_mount_path(
                self.host, data[KEY_DRIVER_NAME], data[KEY_VOLUME_HANDLE]
            )
        except ValueError:  # a driver name that is no path segment
            return False
        return os.path.isdir(os.path.dirname(device))

    def _from_mounts(self, directory: str) -> dict[str, str] | None:
        try:
            table = self.host.get_mounter().table()  # the node's one snapshot
        except OSError as exc:
            log.warning("cannot read the mount table: %s", exc)
            return None
        return volume_data_from_mounts(self.host.get_plugin_dir(CSI_PLUGIN_NAME), directory, table)

    def supports_mount_option(self) -> bool:
        return True

    def supports_selinux_context_mount(self, spec: Spec) -> bool:
        return self.context.selinux_mount_supported(spec)

    def pod_volume_entry(self, name: str) -> PodVolumeEntry:
        return csi_pod_volume_entry(name)

    # --- PersistentVolumePlugin -----------------------------------------------------------

    def get_access_modes(self) -> list[str]:
        return [READ_WRITE_ONCE, READ_ONLY_MANY, READ_WRITE_MANY, READ_WRITE_ONCE_POD]

    # --- attaching and device mounting ------------------------------------------------

    def _attacher(self) -> CSIAttacher:
        return CSIAttacher(self.context)

    def new_attacher(self) -> CSIAttacher:
        return self._attacher()

    def new_detacher(self) -> CSIAttacher:
        return self._attacher()

    def new_device_mounter(self) -> CSIAttacher:
        return self._attacher()

    def new_device_unmounter(self) -> CSIAttacher:
        return self._attacher()

    def can_attach(self, spec: Spec) -> bool:
        """False for ephemeral volumes and drivers whose CSIDriver says no attach is needed.

        Raises what the CSIDriver lookup raises.
        """
        source = self.source(spec)
        if source.ephemeral:
            return False
        return not self.context.skip_attach(source.driver)

    def can_device_mount(self, spec: Spec) -> bool:
        return not self.source(spec).ephemeral

    def get_device_mount_refs(self, device_mount_path: str) -> list[str]:
        """Kubernetes' ``GetMountRefs`` of ``device_mount_path``: every other mount of the
        same filesystem root, blocking or not. Raises
        :class:`~kubevol.errors.MountError` when the mount table cannot be read."""
        return self.host.get_mounter().get_mount_refs(device_mount_path)

    def device_unmount_verdict(
        self, device_mount_path: str, *, table: MountTable | None = None
    ) -> UnmountVerdict:
        """The unstage guard's verdict under :attr:`guard_policy` (the kubelet's rule
        exactly under ``kubelet``), on ``table`` when given. Raises
        :class:`~kubevol.errors.MountError` when the mount table cannot be read."""
        return self.context.check_unmount(
            device_mount_path, _driver_beside(device_mount_path), table=table
        )

    # --- block ------------------------------------------------------------------------

    def new_block_volume_mapper(self, spec: Spec, pod: Pod, opts: VolumeOptions) -> CSIBlockMapper:
        return new_block_mapper(self.context, spec, pod)

    def new_block_volume_unmapper(self, volume_name: str, pod_uid: str) -> CSIBlockMapper:
        return new_block_unmapper(self.context, volume_name, pod_uid)

    def construct_block_volume_spec(self, pod_uid: str, volume_name: str, volume_path: str) -> Spec:
        """Rebuild a Block PersistentVolume from ``volumeDevices/<volume>/data/vol_data.json``.

        Raises :class:`VolumeDataError` when the file is missing, corrupt or lacks a key.
        """
        data_dir = paths.block_data_dir(self.host, volume_name)
        try:
            data = load_volume_data(data_dir)
            spec_name, driver, handle = require(
                data, data_dir, KEY_SPEC_VOL_ID, KEY_DRIVER_NAME, KEY_VOLUME_HANDLE
            )
        except VolumeDataError as exc:
            raise with_context(exc, (
                f"plugin.ConstructBlockVolumeSpec failed loading volume data using "
                f"[{volume_path}]"
            )) from exc
        return reconstructed_spec(spec_name, driver, handle, block=True)

    # --- expansion ----------------------------------------------------------------------

    def requires_fs_resize(self) -> bool:
        return True

    def expand_volume_device(self, spec: Spec, new_size: int, old_size: int) -> int:
        """Grow the volume through the driver's ControllerExpandVolume; returns the new size.

        A driver without the controller EXPAND_VOLUME capability needs no controller step:
        ``new_size`` is returned unchanged. Raises a transient error when the driver is not
        registered, a final one when the call fails.
        """
        return expand_volume_device(self.context, spec, new_size)

    def node_expand(self, options: NodeResizeOptions) -> bool:
        return node_expand(self.context, options)

    # --- attach limits ----------------------------------------------------------------

    def get_volume_limits(self) -> dict[str, int]:
        """``attachable-volumes-csi-<driver>`` for each registered driver that reported a
        ``max_volumes_per_node``."""
        return {
            attach_limit_key(d.name): d.node_info.max_volumes_per_node
            for d in self.registry.drivers()
            if d.node_info.max_volumes_per_node > 0
        }

    def volume_limit_key(self, spec: Spec) -> str:
        return attach_limit_key(self.source(spec).driver)


def _driver_beside(device_mount_path: str) -> str | None:
    """The driver named in the vol_data.json beside a device mount path, if readable."""
    try:
        return load_volume_data(os.path.dirname(device_mount_path)).get(KEY_DRIVER_NAME) or None
    except VolumeDataError:
        return None

