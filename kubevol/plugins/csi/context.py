"""What the CSI plugin's roles share: one :class:`CSIContext` per :class:`CSIPlugin`.

The attacher, mounter, block mapper, expander and metrics provider each need the host, the
registered drivers, the CSIDriver information, the secrets, the parsed source of a Spec
(kept with the Spec), the attach backend and the unstage guard. They get exactly that, as
this object, instead of calling back into the plugin: the plugin builds roles, roles never
import the plugin.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from collections.abc import Mapping

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.errors import KubevolError, SpecError, TransientOperationError
from kubevol.host import AttachDetachVolumeHost, KubeletVolumeHost, VolumeHost
from kubevol.mount.guard import GuardPolicy, UnmountVerdict, check_unmount_device
from kubevol.mount.table import MountTable
from kubevol.plugins.csi.attach import (
    AttachBackend,
    AttachRequest,
    DirectAttachBackend,
    VolumeAttachmentBackend,
)
from kubevol.plugins.csi.driverinfo import CSIDriverInfo, CSIDriverLookup, lookup_driver_info
from kubevol.plugins.csi.registration.registry import DriverNotRegisteredError, DriverRegistry
from kubevol.plugins.csi.rules import secret_lookup_error
from kubevol.plugins.csi.source import (
    SOURCE_KEY,
    CSIVolumeSource,
    SecretRef,
    csi_source,
    volume_capability,
)
from kubevol.spec import Spec
from kubevol.util.deadline import Deadline

log = logging.getLogger(__name__)

#: The kubelet's ``csiTimeout``: per CSI call, and for waiting on attachments.
CSI_TIMEOUT = 120.0


#: How long a driver's answer to NodeGetCapabilities serves the node operations (seconds).
NODE_CAPABILITIES_MAX_AGE = 10.0

class CSIContext:
    """The host, drivers, CSIDriver lookup, secrets, source memo, attach backend and guard
    the CSI plugin's roles work with.

    ``host`` and ``attach_backend`` are known once the plugin's ``init`` called
    :meth:`bind`; using them before raises :class:`RuntimeError`.
    """

    def __init__(
        self,
        *,
        registry: DriverRegistry,
        csi_drivers: CSIDriverLookup | None,
        attach_backend: AttachBackend | None,
        guard_policy: GuardPolicy,
        timeout: float,
        attach_timeout: float,
        deadline: Deadline | None = None,
    ) -> None:
        self.registry = registry
        self.csi_drivers = csi_drivers
        self._attach_backend = attach_backend
        self.guard_policy = guard_policy
        self._timeout = timeout
        self._attach_timeout = attach_timeout
        #: The deadline of the command the plugin serves: every call gets at most what is left.
        self.deadline = deadline or Deadline.never()
        self._host: VolumeHost | None = None

    @property
    def timeout(self) -> float:
        """The timeout of the next CSI call: the per-call limit, capped by the deadline."""
        return self.deadline.cap(self._timeout)

    @property
    def attach_timeout(self) -> float:
        """How long the next wait for an attachment may take, capped by the deadline."""
        return self.deadline.cap(self._attach_timeout)

    def bind(self, host: VolumeHost) -> None:
        """Complete the context once the plugin knows its host (the plugin's ``init``): the
        CSIDriver lookup defaults to the host's, the attach backend to VolumeAttachments
        when the host has a Kubernetes client, else to the driver's own controller."""
        self._host = host
        if self.csi_drivers is None and isinstance(
            host, KubeletVolumeHost | AttachDetachVolumeHost
        ):
            self.csi_drivers = host.get_csi_driver
        if self._attach_backend is None:
            kube = host.get_kube_client()
            self._attach_backend = (
                VolumeAttachmentBackend(kube) if kube is not None
                else DirectAttachBackend(self.registry)
            )

    @property
    def host(self) -> VolumeHost:
        """The host the plugin was initialised with."""
        if self._host is None:
            raise RuntimeError("CSIPlugin used before init()")
        return self._host

    @property
    def attach_backend(self) -> AttachBackend:
        """The attachment backend in use (chosen at the plugin's ``init`` unless given)."""
        if self._attach_backend is None:
            raise RuntimeError("CSIPlugin used before init()")
        return self._attach_backend

    def root_dir(self) -> str:
        """The kubelet root the host lays volumes out under."""
        root = getattr(self.host, "root_dir", None)
        return str(root) if root else os.path.dirname(self.host.get_pods_dir())

    # --- drivers ----------------------------------------------------------------------

    def client(self, driver: str) -> CSIClient:
        """The registered driver's client; :class:`DriverNotRegisteredError` if it is not."""
        return self.registry.client(driver)

    def transient_client(self, driver: str, where: str) -> CSIClient:
        """:meth:`client`, a missing driver being transient (kubernetes#120268)."""
        try:
            return self.client(driver)
        except DriverNotRegisteredError as exc:
            raise TransientOperationError(f"{where} failed to get CSI client: {exc}") from exc

    def node_capabilities(self, client: CSIClient) -> frozenset[t.NodeCapability]:
        """The driver's node capabilities, asked again once the last answer is
        :data:`NODE_CAPABILITIES_MAX_AGE` old. The kubelet asks before each stage, publish,
        unstage and expansion: a burst of pods made two such calls per pod for the same
        answer (a driver's capabilities change only with the driver: one that registers
        again has a new client, asked at once; one restarted behind the same socket is
        asked within that time)."""
        return client.node_get_capabilities(max_age=NODE_CAPABILITIES_MAX_AGE,
                                            timeout=self.timeout)

    def driver_info(self, driver: str) -> CSIDriverInfo | None:
        """The driver's CSIDriver information, None when it has no object.

        Waits for the host's CSIDriver cache first. Raises what the lookup raises.
        """
        if self.csi_drivers is None:
            return None
        if isinstance(self.host, KubeletVolumeHost):
            self.host.wait_for_cache_sync()
        return lookup_driver_info(self.csi_drivers, driver)

    def selinux_mount_supported(self, spec: Spec) -> bool:
        """Whether the driver of ``spec`` mounts with ``-o context`` (CSIDriver
        ``seLinuxMount``); a lookup that fails counts as no."""
        try:
            info = self.driver_info(self.source(spec).driver)
        except Exception as exc:
            log.warning("cannot tell whether %s supports SELinux mounts: %s", spec.name(), exc)
            return False
        return info is not None and info.selinux_mount

    # --- the Spec's source ------------------------------------------------------------

    def source(self, spec: Spec) -> CSIVolumeSource:
        """The CSI fields of ``spec`` (:func:`~kubevol.plugins.csi.source.csi_source`), read
        once per Spec: like the kubelet, kubevol treats the API objects inside a Spec as
        immutable. Raises :class:`~kubevol.errors.SpecError` as ``csi_source`` does (a
        failure is not remembered)."""
        return spec.derived(SOURCE_KEY, csi_source)

    def persistent_source(self, spec: Spec) -> CSIVolumeSource:
        """:meth:`source` for a CSI PersistentVolume only (the kubelet's
        ``getPVSourceFromSpec``); :class:`~kubevol.errors.SpecError` for an inline volume."""
        source = self.source(spec)
        if source.ephemeral:
            raise SpecError(
                f"volume {spec.name()!r} is an inline CSI volume; this needs a CSI PersistentVolume"
            )
        return source

    # --- secrets ----------------------------------------------------------------------

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

    def call_secrets(
        self,
        ref: SecretRef | None,
        pod_namespace: str,
        field: str,
        error: type[KubevolError] = TransientOperationError,
    ) -> dict[str, str]:
        """:meth:`secrets` for one CSI call: a Secret that cannot be read raises ``error``
        (transient by default, as the kubelet retries it) with the kubelet's message naming
        ``field`` (``NodeStageSecretRef``, ...)."""
        try:
            return self.secrets(ref, pod_namespace)
        except KubevolError as exc:
            assert ref is not None  # only a reference can fail
            raise error(secret_lookup_error(ref, pod_namespace, exc, field)) from exc

    # --- attachment -------------------------------------------------------------------

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

    # --- the unstage guard ------------------------------------------------------------

    def check_unmount(
        self, device_mount_path: str, driver: str | None, *, table: MountTable | None = None
    ) -> UnmountVerdict:
        """The unstage guard's verdict on ``device_mount_path`` under :attr:`guard_policy`,
        for a volume of ``driver`` (None: unknown, so no detach is expected), on ``table``
        (None: the mount table as it is now)."""
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
            table=table,
        )
