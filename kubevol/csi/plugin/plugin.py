"""``CSIPlugin``: the kubelet's ``kubernetes.io/csi`` volume plugin, driving any CSI driver.

One instance serves every CSI driver registered in its :class:`DriverRegistry`. What the
plugin needs to know about a driver beyond its socket (attach required? pod info?
fsGroup policy? ephemeral allowed?) comes from ONE lookup ``name -> V1CSIDriver | None``:
the one given to the constructor, else the host's ``get_csi_driver`` (see
:mod:`kubevol.csi.driverinfo`). Attachment goes through an
:class:`~kubevol.csi.attach.AttachBackend`: VolumeAttachments when the host has a
Kubernetes client, else the driver's own controller (direct).

Errors follow the kubelet: a driver that is not registered, a CSIDriver lookup, a
publish-context or secret lookup that fails are transient
(:class:`~kubevol.errors.TransientOperationError`); non-final stage/publish/expand
failures are uncertain; everything else is final.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kubevol.csi import types as t
from kubevol.csi.attach import (
    AttachBackend,
    AttachRequest,
    DirectAttachBackend,
    VolumeAttachmentBackend,
)
from kubevol.csi.client import CSIClient
from kubevol.csi.driverinfo import (
    LIFECYCLE_EPHEMERAL,
    LIFECYCLE_PERSISTENT,
    CSIDriverInfo,
    CSIDriverLookup,
    lookup_driver_info,
)
from kubevol.csi.plugin import paths
from kubevol.csi.plugin.rules import attach_limit_key
from kubevol.csi.plugin.source import (
    READ_ONLY_MANY,
    READ_WRITE_MANY,
    READ_WRITE_ONCE,
    READ_WRITE_ONCE_POD,
    CSIVolumeSource,
    SecretRef,
    csi_source,
    is_csi_spec,
    volume_capability,
)
from kubevol.csi.plugin.voldata import (
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
from kubevol.csi.registration.registry import DriverNotRegisteredError, DriverRegistry
from kubevol.errors import KubevolError, SpecError, TransientOperationError
from kubevol.host import AttachDetachVolumeHost, KubeletVolumeHost, VolumeHost
from kubevol.layout import PodVolumeEntry, csi_pod_volume_entry
from kubevol.mount.guard import GuardPolicy, UnmountVerdict, check_unmount_device
from kubevol.plugin import (
    AttachableVolumePlugin,
    BlockVolumePlugin,
    ExpandableVolumePlugin,
    NodeExpandableVolumePlugin,
    PersistentVolumePlugin,
    VolumePluginWithAttachLimits,
)
from kubevol.spec import Spec, api_object, pod_uid
from kubevol.types import NodeResizeOptions, ReconstructedVolume, VolumeOptions

if TYPE_CHECKING:
    from kubevol.csi.plugin.attacher import CSIAttacher
    from kubevol.csi.plugin.block import CSIBlockMapper
    from kubevol.csi.plugin.mounter import CSIMounter

log = logging.getLogger(__name__)

CSI_PLUGIN_NAME = paths.CSI_PLUGIN_NAME

#: The kubelet's ``csiTimeout``: per CSI call, and for waiting on attachments.
CSI_TIMEOUT = 120.0

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
    :attr:`registry` or let a :class:`~kubevol.csi.registration.PluginWatcher` do it).
    ``csi_drivers`` is the CSIDriver lookup (default: the host's ``get_csi_driver``).
    ``attach_backend`` defaults to VolumeAttachments when the host has a Kubernetes client,
    else to direct ControllerPublish. ``guard_policy`` picks the unstage guard's rules
    (``safe`` or ``kubelet``). ``timeout`` bounds each CSI call; ``attach_timeout`` the
    wait for an attachment.
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
    ) -> None:
        self.registry = registry if registry is not None else DriverRegistry()
        self._csi_drivers = csi_drivers
        self._attach_backend = attach_backend
        self.guard_policy = GuardPolicy(guard_policy)
        self.timeout = timeout
        self.attach_timeout = attach_timeout
        self._host: VolumeHost | None = None
        # The parsed CSI source of each Spec seen, for as long as the Spec lives: the node
        # layer asks about one Spec five or six times per operation (name, attach, device
        # mount, mounter, paths) and parsing it each time was a third of reconstruction.
        self._sources: weakref.WeakKeyDictionary[Spec, CSIVolumeSource] = (
            weakref.WeakKeyDictionary()
        )

    # --- set-up ---------------------------------------------------------------------

    @property
    def host(self) -> VolumeHost:
        """The host given to :meth:`init`."""
        if self._host is None:
            raise RuntimeError("CSIPlugin used before init()")
        return self._host

    @property
    def attach_backend(self) -> AttachBackend:
        """The attachment backend in use (chosen at :meth:`init` unless given)."""
        if self._attach_backend is None:
            raise RuntimeError("CSIPlugin used before init()")
        return self._attach_backend

    def init(self, host: VolumeHost) -> None:
        self._host = host
        if self._csi_drivers is None and isinstance(
            host, KubeletVolumeHost | AttachDetachVolumeHost
        ):
            self._csi_drivers = host.get_csi_driver
        if self._attach_backend is None:
            kube = host.get_kube_client()
            self._attach_backend = (
                VolumeAttachmentBackend(kube) if kube is not None
                else DirectAttachBackend(self.registry)
            )

    def get_plugin_name(self) -> str:
        return CSI_PLUGIN_NAME

    # --- what the other parts of the plugin use ---------------------------------------

    def root_dir(self) -> str:
        """The kubelet root the host lays volumes out under."""
        root = getattr(self.host, "root_dir", None)
        return str(root) if root else os.path.dirname(self.host.get_pods_dir())

    def client(self, driver: str) -> CSIClient:
        """The registered driver's client; :class:`DriverNotRegisteredError` if it is not."""
        return self.registry.client(driver)

    def transient_client(self, driver: str, where: str) -> CSIClient:
        """:meth:`client`, a missing driver being transient (kubernetes#120268)."""
        try:
            return self.client(driver)
        except DriverNotRegisteredError as exc:
            raise TransientOperationError(f"{where} failed to get CSI client: {exc}") from exc

    def source(self, spec: Spec) -> CSIVolumeSource:
        """The CSI fields of ``spec`` (:func:`~kubevol.csi.plugin.source.csi_source`), read
        once per Spec: like the kubelet, kubevol treats the API objects inside a Spec as
        immutable. Raises :class:`~kubevol.errors.SpecError` as ``csi_source`` does (a
        failure is not remembered)."""
        source = self._sources.get(spec)
        if source is None:
            source = self._sources[spec] = csi_source(spec)
        return source

    def persistent_source(self, spec: Spec) -> CSIVolumeSource:
        """:meth:`source` for a CSI PersistentVolume only (the kubelet's
        ``getPVSourceFromSpec``); :class:`~kubevol.errors.SpecError` for an inline volume."""
        source = self.source(spec)
        if source.ephemeral:
            raise SpecError(
                f"volume {spec.name()!r} is an inline CSI volume; this needs a CSI PersistentVolume"
            )
        return source

    def node_capabilities(self, client: CSIClient) -> frozenset[t.NodeCapability]:
        """Ask the driver its node capabilities now (the kubelet asks before each use)."""
        return client.node_get_capabilities(refresh=True, timeout=self.timeout)

    def driver_info(self, driver: str) -> CSIDriverInfo | None:
        """The driver's CSIDriver information, None when it has no object.

        Waits for the host's CSIDriver cache first. Raises what the lookup raises.
        """
        if self._csi_drivers is None:
            return None
        if isinstance(self.host, KubeletVolumeHost):
            self.host.wait_for_cache_sync()
        return lookup_driver_info(self._csi_drivers, driver)

    def skip_attach(self, driver: str) -> bool:
        """True when the driver's CSIDriver says ``attachRequired: false``."""
        info = self.driver_info(driver)
        return info is not None and not info.attach_required

    def attach_follows(self, driver: str) -> bool:
        """Whether this volume is attached, so that a detach follows its unstage."""
        return not self.skip_attach(driver) and self.attach_backend.attaches(driver)

    def attach_request(
        self, source: CSIVolumeSource, node_name: str, *, secrets: Mapping[str, str] | None = None
    ) -> AttachRequest:
        """What the attach backend needs to know about ``source`` on ``node_name``."""
        snmw = self.registry.is_registered(source.driver) and self._controller_snmw(source.driver)
        capability = volume_capability(
            source.access_mode,
            "block" if source.block else source.fs_type,
            single_node_multi_writer=snmw,
            mount_options=source.mount_options,
        )
        return AttachRequest(
            driver=source.driver,
            volume_handle=source.volume_handle,
            node_name=node_name,
            pv_name=source.pv_name,
            capability=capability,
            read_only=source.read_only,
            volume_context=source.volume_attributes,
            secrets=dict(secrets or {}),
        )

    def _controller_snmw(self, driver: str) -> bool:
        backend = self.attach_backend
        if isinstance(backend, DirectAttachBackend):
            try:
                caps = backend.controller_capabilities(driver)
            except KubevolError:
                return False
            return t.ControllerCapability.SINGLE_NODE_MULTI_WRITER in caps
        return False

    def publish_context(self, source: CSIVolumeSource) -> dict[str, str] | None:
        """The publish context for NodeStage/NodePublish; None when no attach is needed.

        Raises what the CSIDriver lookup or the attach backend raises (callers make it
        transient, as the kubelet does).
        """
        if self.skip_attach(source.driver):
            return None
        request = self.attach_request(
            source, self.host.get_node_name(),
            secrets=self.secrets(source.controller_publish_secret_ref, ""),
        )
        return self.attach_backend.publish_context(request)

    def secrets(self, ref: SecretRef | None, pod_namespace: str) -> dict[str, str]:
        """The data of Secret ``ref`` (namespace defaulting to the pod's), decoded.

        Empty when ``ref`` is None. Raises :class:`~kubevol.errors.KubevolError` when it
        cannot be read.
        """
        if ref is None:
            return {}
        namespace = ref.namespace or pod_namespace
        try:
            secret = self.host.get_secret_func()(namespace, ref.name)
        except Exception as exc:
            raise KubevolError(f"cannot read secret {namespace}/{ref.name}: {exc}") from exc
        out: dict[str, str] = {}
        for key, value in (getattr(secret, "data", None) or {}).items():
            try:
                out[key] = base64.b64decode(value, validate=True).decode("utf-8", "surrogateescape")
            except (binascii.Error, ValueError) as exc:
                raise KubevolError(
                    f"secret {namespace}/{ref.name} key {key!r} is not valid base64"
                ) from exc
        return out

    def check_unmount(self, device_mount_path: str, driver: str | None) -> UnmountVerdict:
        """The unstage guard's verdict on ``device_mount_path`` under :attr:`guard_policy`,
        for a volume of ``driver`` (None: unknown, so no detach is expected)."""
        detach = False
        if driver:
            try:
                detach = self.attach_follows(driver)
            except Exception as exc:
                # Not knowing is treated as "a detach follows": the stricter answer.
                log.warning("cannot tell whether %s volumes are detached: %s", driver, exc)
                detach = True
        return check_unmount_device(
            device_mount_path,
            root_dir=self.root_dir(),
            policy=self.guard_policy,
            detach_follows=detach,
        )

    # --- VolumePlugin ---------------------------------------------------------------

    def get_volume_name(self, spec: Spec) -> str:
        source = self.persistent_source(spec)
        return paths.volume_name(source.driver, source.volume_handle)

    def can_support(self, spec: Spec) -> bool:
        return is_csi_spec(spec)

    def requires_remount(self, spec: Spec) -> bool:
        try:
            info = self.driver_info(self.source(spec).driver)
        except Exception as exc:
            log.warning("cannot tell whether %s requires republish: %s", spec.name(), exc)
            return False
        return info is not None and info.requires_republish

    def new_mounter(self, spec: Spec, pod: Any, opts: VolumeOptions) -> CSIMounter:
        from kubevol.csi.plugin.mounter import CSIMounter
        source = self.source(spec)
        uid = pod_uid(pod)
        handle = (
            paths.ephemeral_volume_handle(uid, spec.name()) if source.ephemeral
            else source.volume_handle
        )
        return CSIMounter(
            plugin=self,
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
        from kubevol.csi.plugin.mounter import CSIMounter

        directory = paths.pod_volume_dir(self.host, pod_uid, volume_name)
        try:
            data = load_volume_data(directory)
            driver, handle = require(data, directory, KEY_DRIVER_NAME, KEY_VOLUME_HANDLE)
        except VolumeDataError as exc:
            raise with_context(exc, (
                f"unmounter failed to load volume data file [{directory}]"
            )) from exc
        return CSIMounter(
            plugin=self,
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
        try:
            data = load_volume_data(volume_path)
            spec_name, driver = require(data, volume_path, KEY_SPEC_VOL_ID, KEY_DRIVER_NAME)
        except VolumeDataError as exc:
            raise with_context(exc, (
                f"plugin.ConstructVolumeSpec failed loading volume data using [{volume_path}]"
            )) from exc
        selinux = data.get(KEY_SELINUX_MOUNT_CONTEXT, "")
        if data.get(KEY_LIFECYCLE_MODE) == LIFECYCLE_EPHEMERAL:
            volume = api_object("V1Volume", {"name": spec_name, "csi": {"driver": driver}})
            return ReconstructedVolume(spec=Spec.from_volume(volume), selinux_mount_context=selinux)
        (handle,) = require(data, volume_path, KEY_VOLUME_HANDLE)
        pv = _persistent_volume(spec_name, driver, handle, "Filesystem")
        return ReconstructedVolume(
            spec=Spec.from_persistent_volume(pv), selinux_mount_context=selinux
        )

    def supports_mount_option(self) -> bool:
        return True

    def supports_selinux_context_mount(self, spec: Spec) -> bool:
        try:
            info = self.driver_info(self.source(spec).driver)
        except Exception as exc:
            log.warning("cannot tell whether %s supports SELinux mounts: %s", spec.name(), exc)
            return False
        return info is not None and info.selinux_mount

    def pod_volume_entry(self, name: str) -> PodVolumeEntry:
        return csi_pod_volume_entry(name)

    # --- PersistentVolumePlugin -----------------------------------------------------------

    def get_access_modes(self) -> list[str]:
        return [READ_WRITE_ONCE, READ_ONLY_MANY, READ_WRITE_MANY, READ_WRITE_ONCE_POD]

    # --- attaching and device mounting ------------------------------------------------

    def _attacher(self) -> CSIAttacher:
        from kubevol.csi.plugin.attacher import CSIAttacher

        return CSIAttacher(self)

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
        return not self.skip_attach(source.driver)

    def can_device_mount(self, spec: Spec) -> bool:
        return not self.source(spec).ephemeral

    def get_device_mount_refs(self, device_mount_path: str) -> list[str]:
        """Kubernetes' ``GetMountRefs`` of ``device_mount_path``: every other mount of the
        same filesystem root, blocking or not. Raises
        :class:`~kubevol.errors.MountError` when the mount table cannot be read."""
        return self.host.get_mounter().get_mount_refs(device_mount_path)

    def device_unmount_verdict(self, device_mount_path: str) -> UnmountVerdict:
        """The unstage guard's verdict under :attr:`guard_policy` (the kubelet's rule
        exactly under ``kubelet``). Raises :class:`~kubevol.errors.MountError` when the
        mount table cannot be read."""
        return self.check_unmount(device_mount_path, _driver_beside(device_mount_path))

    # --- block ------------------------------------------------------------------------

    def new_block_volume_mapper(self, spec: Spec, pod: Any, opts: VolumeOptions) -> CSIBlockMapper:
        from kubevol.csi.plugin.block import new_block_mapper

        return new_block_mapper(self, spec, pod)

    def new_block_volume_unmapper(self, volume_name: str, pod_uid: str) -> CSIBlockMapper:
        from kubevol.csi.plugin.block import new_block_unmapper

        return new_block_unmapper(self, volume_name, pod_uid)

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
        return Spec.from_persistent_volume(_persistent_volume(spec_name, driver, handle, "Block"))

    # --- expansion ----------------------------------------------------------------------

    def requires_fs_resize(self) -> bool:
        return True

    def expand_volume_device(self, spec: Spec, new_size: int, old_size: int) -> int:
        """Grow the volume through the driver's ControllerExpandVolume; returns the new size.

        A driver without the controller EXPAND_VOLUME capability needs no controller step:
        ``new_size`` is returned unchanged. Raises a transient error when the driver is not
        registered, a final one when the call fails.
        """
        from kubevol.csi.plugin.expander import expand_volume_device

        return expand_volume_device(self, spec, new_size)

    def node_expand(self, options: NodeResizeOptions) -> bool:
        from kubevol.csi.plugin.expander import node_expand

        return node_expand(self, options)

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


def _persistent_volume(name: str, driver: str, handle: str, mode: str) -> Any:
    return api_object("V1PersistentVolume", {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"csi": {"driver": driver, "volumeHandle": handle}, "volumeMode": mode},
    })


def _driver_beside(device_mount_path: str) -> str | None:
    """The driver named in the vol_data.json beside a device mount path, if readable."""
    try:
        return load_volume_data(os.path.dirname(device_mount_path)).get(KEY_DRIVER_NAME) or None
    except VolumeDataError:
        return None

