"""The CSI plugin's attacher, detacher, device mounter and device unmounter (the kubelet's
``csiAttacher``): attachment through the plugin's backend, and staging with NodeStageVolume
at ``plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount``.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Sequence

from kubevol.csi import types as t
from kubevol.errors import (
    KubevolError,
    OperationError,
    SpecError,
    TransientOperationError,
    is_operation_finished,
)
from kubevol.k8s.pod import Pod
from kubevol.mount.guard import UnmountVerdict
from kubevol.plugins.csi import paths
from kubevol.plugins.csi.context import CSIContext
from kubevol.plugins.csi.rules import remove_mount_dir
from kubevol.plugins.csi.source import volume_capability
from kubevol.plugins.csi.voldata import (
    KEY_DRIVER_NAME,
    KEY_SELINUX_MOUNT_CONTEXT,
    KEY_VOLUME_HANDLE,
    VolumeDataMissingError,
    load_volume_data,
    require,
    save_volume_data,
)
from kubevol.spec import Spec
from kubevol.types import DeviceMounterArgs
from kubevol.volume import Attacher, Detacher

log = logging.getLogger(__name__)


class CSIAttacher(Attacher, Detacher):
    """Attaches, stages, unstages and detaches CSI persistent volumes."""

    def __init__(self, ctx: CSIContext) -> None:
        self.ctx = ctx

    # --- attach ---------------------------------------------------------------------

    def attach(self, spec: Spec, node_name: str) -> str:
        """Attach through the backend and wait (up to the plugin's ``attach_timeout``).

        Returns ``""``: CSI has no device path; the attachment id is derived when needed.
        Does nothing for drivers whose CSIDriver says ``attachRequired: false``.
        """
        source = self.ctx.persistent_source(spec)
        if self.ctx.skip_attach(source.driver):
            return ""
        request = self.ctx.attach_request(
            source,
            node_name,
            secrets=self.ctx.secrets(source.controller_publish_secret_ref, ""),
        )
        self.ctx.attach_backend.attach(request, timeout=self.ctx.attach_timeout)
        return ""

    def volumes_are_attached(self, specs: Sequence[Spec], node_name: str) -> dict[Spec, bool]:
        """Attachment state per spec; a spec that cannot be read counts as not attached and
        a driver that needs no attach as attached."""
        attached: dict[Spec, bool] = {}
        for spec in specs:
            try:
                source = self.ctx.persistent_source(spec)
            except SpecError as exc:
                log.error("attacher.VolumesAreAttached: %s", exc)
                attached[spec] = False
                continue
            try:
                if self.ctx.skip_attach(source.driver):
                    attached[spec] = True
                    continue
            except Exception as exc:
                log.error("failed to check CSIDriver for %s: %s", source.driver, exc)
            request = self.ctx.attach_request(source, node_name)
            attached[spec] = self.ctx.attach_backend.is_attached(request)
        return attached

    def wait_for_attach(
        self, spec: Spec, device_path: str, pod: Pod, timeout: datetime.timedelta
    ) -> str:
        """One check that the volume is attached to this node (the kubelet does no more);
        returns the attachment id, raises when it is not attached yet."""
        source = self.ctx.persistent_source(spec)
        request = self.ctx.attach_request(source, self.ctx.host.get_node_name())
        if self.ctx.skip_attach(source.driver):
            return request.attachment_id
        return self.ctx.attach_backend.wait_for_attach(request)

    def detach(self, volume_name: str, node_name: str) -> None:
        """Detach ``driver^handle`` from ``node_name`` and wait until it is detached."""
        driver, handle = self._split(volume_name)
        self.ctx.attach_backend.detach(
            driver, handle, node_name, timeout=self.ctx.attach_timeout
        )

    def detaches(self, volume_name: str, *, ask: bool = True) -> bool:
        """False when the attach backend attaches nothing for the volume's driver (one
        without PUBLISH_UNPUBLISH_VOLUME, on a node that attaches by itself): its detach
        does nothing. True when that cannot be told: the stricter answer."""
        try:
            driver, _ = self._split(volume_name)
            if not ask:
                return self.ctx.attach_backend.attaches_known(driver) is not False
            return self.ctx.attach_backend.attaches(driver)
        except Exception as exc:
            log.warning("cannot tell whether detaching %s does anything: %s", volume_name, exc)
            return True

    @staticmethod
    def _split(volume_name: str) -> tuple[str, str]:
        """``driver^handle`` split; raises :class:`OperationError` for a malformed name."""
        if not volume_name:
            raise OperationError("missing expected parameter volumeName")
        try:
            return paths.split_volume_name(volume_name)
        except ValueError as exc:
            raise OperationError(f"volumeName missing expected data: {exc}") from exc

    # --- device mount (stage) ---------------------------------------------------------

    def get_device_mount_path(self, spec: Spec) -> str:
        source = self.ctx.persistent_source(spec)
        return paths.device_mount_path(self.ctx.host, source.driver, source.volume_handle)

    def mount_device(
        self, spec: Spec, device_path: str, device_mount_path: str, args: DeviceMounterArgs
    ) -> None:
        """Record vol_data.json beside ``device_mount_path`` and NodeStageVolume there when
        the driver has STAGE_UNSTAGE_VOLUME. Idempotent (the driver's stage is).

        Transient: driver not registered, publish context or secrets unavailable,
        VOLUME_MOUNT_GROUP unknown. Uncertain: a non-final stage failure. A final failure
        removes the directory and vol_data.json it created.
        """
        if not device_mount_path:
            raise OperationError("attacher.MountDevice failed, deviceMountPath is empty")
        source = self.ctx.persistent_source(spec)
        ctx = self.ctx
        client = ctx.transient_client(source.driver, "attacher.MountDevice")
        try:
            caps = ctx.node_capabilities(client)
        except KubevolError as exc:
            raise OperationError(
                f"attacher.MountDevice failed to check for STAGE_UNSTAGE_VOLUME capability: {exc}"
            ) from exc
        staging = t.NodeCapability.STAGE_UNSTAGE_VOLUME in caps
        try:
            publish_context = ctx.publish_context(source)
        except Exception as exc:
            raise TransientOperationError(str(exc)) from exc
        secrets: dict[str, str] = {}
        if staging:
            secrets = ctx.call_secrets(source.node_stage_secret_ref, "", "NodeStageSecretRef")
        mount_options = source.mount_options
        selinux = ""
        if ctx.selinux_mount_supported(spec) and args.selinux_label:
            selinux = args.selinux_label
            mount_options = (*mount_options, f'context="{selinux}"')
        try:
            os.makedirs(device_mount_path, mode=0o750, exist_ok=True)
        except OSError as exc:
            raise OperationError(
                f"attacher.MountDevice failed to create dir {device_mount_path!r}: {exc}"
            ) from exc
        data = {KEY_VOLUME_HANDLE: source.volume_handle, KEY_DRIVER_NAME: source.driver}
        if selinux:
            data[KEY_SELINUX_MOUNT_CONTEXT] = selinux
        try:
            save_volume_data(os.path.dirname(device_mount_path), data)
        except OSError as exc:
            self._cleanup(device_mount_path)
            raise OperationError(f"failed to save volume info data: {exc}") from exc
        if not staging:
            # vol_data.json stays: unmount_device needs it even without a stage.
            log.info("attacher.MountDevice STAGE_UNSTAGE_VOLUME capability not set, skipping")
            return
        mount_group = ""
        if t.NodeCapability.VOLUME_MOUNT_GROUP in caps and args.fs_group is not None:
            mount_group = str(args.fs_group)
        capability = volume_capability(
            source.access_mode,
            source.fs_type,
            single_node_multi_writer=t.NodeCapability.SINGLE_NODE_MULTI_WRITER in caps,
            mount_options=mount_options,
            volume_mount_group=mount_group,
        )
        try:
            client.node_stage_volume(
                source.volume_handle,
                device_mount_path,
                capability,
                publish_context=publish_context,
                secrets=secrets,
                volume_context=source.volume_attributes,
                timeout=ctx.timeout,
            )
        except Exception as exc:
            if is_operation_finished(exc):
                self._cleanup(device_mount_path)
            raise

    def _cleanup(self, device_mount_path: str) -> None:
        try:
            remove_mount_dir(self.ctx.host, device_mount_path)
        except OSError as exc:
            log.error("attacher.MountDevice failed to remove mount dir after error [%s]: %s",
                      device_mount_path, exc)

    # --- device unmount (unstage) -----------------------------------------------------

    def unmount_device(
        self, device_mount_path: str, *, verdict: UnmountVerdict | None = None
    ) -> None:
        """Check the unstage guard (``verdict`` when the caller has it already),
        NodeUnstageVolume (when the driver stages), then remove the directory and
        vol_data.json. Idempotent: without vol_data.json there is nothing to do.

        Raises :class:`~kubevol.errors.DeviceStillMountedError` when the guard refuses
        (under ``kubelet``, with the kubelet's message), ValueError for a verdict about
        another path, a transient error when the driver is not registered, a final error
        when the unstage fails.
        """
        data_dir = os.path.dirname(device_mount_path)
        try:
            data = load_volume_data(data_dir)
        except VolumeDataMissingError:
            log.info("attacher.UnmountDevice skipped: no volume data file in [%s]", data_dir)
            return
        driver, handle = require(data, data_dir, KEY_DRIVER_NAME, KEY_VOLUME_HANDLE)
        if verdict is None:
            verdict = self.ctx.check_unmount(device_mount_path, driver)
        elif os.path.abspath(verdict.path) != os.path.abspath(device_mount_path):
            raise ValueError(f"the verdict is about {verdict.path}, not {device_mount_path}")
        verdict.raise_if_blocked()
        client = self.ctx.transient_client(driver, "attacher.UnmountDevice")
        try:
            caps = self.ctx.node_capabilities(client)
        except KubevolError as exc:
            raise OperationError(
                "attacher.UnmountDevice failed to check whether STAGE_UNSTAGE_VOLUME set: "
                f"{exc}"
            ) from exc
        if t.NodeCapability.STAGE_UNSTAGE_VOLUME in caps:
            try:
                client.node_unstage_volume(handle, device_mount_path, timeout=self.ctx.timeout)
            except KubevolError as exc:
                raise OperationError(f"attacher.UnmountDevice failed: {exc}") from exc
        try:
            remove_mount_dir(self.ctx.host, device_mount_path)
        except OSError as exc:
            raise OperationError(
                f"failed to clean up global mount {data_dir}: {exc}"
            ) from exc
