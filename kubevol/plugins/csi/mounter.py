"""The CSI plugin's mounter and unmounter (the kubelet's ``csiMountMgr``): NodePublishVolume
at ``pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount`` with vol_data.json beside it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.errors import (
    KubevolError,
    OperationError,
    TransientOperationError,
    UncertainProgressError,
    is_operation_finished,
)
from kubevol.k8s.pod import Pod
from kubevol.plugins.csi import paths
from kubevol.plugins.csi.attach import attachment_name
from kubevol.plugins.csi.context import CSIContext
from kubevol.plugins.csi.driverinfo import CSIDriverInfo, FSGroupPolicy
from kubevol.plugins.csi.metrics import CSIMetrics, PendingMetrics
from kubevol.plugins.csi.rules import (
    SERVICE_ACCOUNT_TOKENS_KEY,
    fs_group_policy,
    kubelet_applies_fs_group,
    lifecycle_mode_problem,
    pod_info_attributes,
    remove_mount_dir,
    service_account_tokens,
)
from kubevol.plugins.csi.source import CSIVolumeSource, volume_capability
from kubevol.plugins.csi.voldata import (
    KEY_ATTACHMENT_ID,
    KEY_DRIVER_NAME,
    KEY_LIFECYCLE_MODE,
    KEY_NODE_NAME,
    KEY_SELINUX_MOUNT_CONTEXT,
    KEY_SPEC_VOL_ID,
    KEY_VOLUME_HANDLE,
    save_volume_data,
)
from kubevol.plugins.ownership import set_volume_ownership
from kubevol.spec import Spec
from kubevol.types import Attributes, MounterArgs
from kubevol.volume import Metrics, Mounter, Unmounter

log = logging.getLogger(__name__)


class CSIMounter(Mounter, Unmounter):
    """Publishes one CSI volume for one pod, and unpublishes it.

    An unmounter (made from vol_data.json after a restart) has no ``spec`` or ``pod`` and
    can only tear down.
    """

    def __init__(
        self,
        *,
        ctx: CSIContext,
        spec: Spec | None,
        pod: Pod | None,
        pod_uid: str,
        spec_name: str,
        driver: str,
        volume_handle: str,
        lifecycle_mode: str,
        read_only: bool,
    ) -> None:
        self.ctx = ctx
        self.spec = spec
        self.pod = pod
        self.pod_uid = pod_uid
        self.spec_name = spec_name
        self.driver = driver
        self.volume_handle = volume_handle
        self.lifecycle_mode = lifecycle_mode
        self.read_only = read_only
        self._selinux_relabel = False
        # Validates the names now, so a bad one fails before anything is created.
        self._path = paths.pod_mount_path(ctx.host, pod_uid, spec_name)

    def get_path(self) -> str:
        return self._path

    def can_mount(self) -> None:
        """CSI drivers bring what they need; nothing to check on the node."""

    def get_attributes(self) -> Attributes:
        return Attributes(
            read_only=self.read_only, managed=not self.read_only,
            selinux_relabel=self._selinux_relabel,
        )

    def get_metrics(self) -> Metrics:
        return self._metrics().get_metrics()

    def metrics_starter(self) -> Callable[[], PendingMetrics] | None:
        """See :meth:`CSIMetrics.metrics_starter`."""
        return self._metrics().metrics_starter()

    def _metrics(self) -> CSIMetrics:
        return CSIMetrics(
            ctx=self.ctx, driver=self.driver, volume_id=self.volume_handle,
            target_path=self.get_path(),
        )

    def set_up_at(self, directory: str, args: MounterArgs) -> None:
        """NodePublishVolume at ``directory`` (the driver creates it; its parent is created
        here, with vol_data.json in it).

        Transient: driver not registered, CSIDriver lookup failing, lifecycle mode not
        allowed, no fsGroup policy, publish context/secrets/VOLUME_MOUNT_GROUP unknown,
        vol_data.json not written. Uncertain: a non-final publish failure, or fsGroup
        ownership failing after the publish. A final failure removes what was created.
        """
        if self.spec is None or self.pod is None:
            raise OperationError(
                f"cannot set up CSI volume {self.spec_name!r}: this is an unmounter "
                "(no spec or pod)"
            )
        ctx = self.ctx
        client = ctx.transient_client(self.driver, "mounter.SetUpAt")
        source = self.ctx.source(self.spec)
        info, policy = self._driver_policy()
        caps, device_mount_path, publish_context = self._persistent_inputs(client, source)
        parent = os.path.dirname(directory)
        try:
            os.makedirs(parent, mode=0o750, exist_ok=True)
        except OSError as exc:
            raise OperationError(f"mounter.SetUpAt failed to create dir {parent!r}: {exc}") from exc
        secrets, volume_context = self._publish_inputs(source, info, self.pod)
        if caps is None:
            try:
                caps = ctx.node_capabilities(client)
            except KubevolError as exc:
                raise TransientOperationError(
                    "mounter.SetUpAt failed to determine if the node service has "
                    f"VOLUME_MOUNT_GROUP capability: {exc}"
                ) from exc
        mount_group_by_driver = t.NodeCapability.VOLUME_MOUNT_GROUP in caps
        mount_options = source.mount_options
        selinux = ""
        if info is not None and info.selinux_mount and args.selinux_label:
            selinux = args.selinux_label
            mount_options = (*mount_options, f'context="{selinux}"')
        self._record(directory, selinux)
        capability = volume_capability(
            source.access_mode,
            source.fs_type,
            single_node_multi_writer=t.NodeCapability.SINGLE_NODE_MULTI_WRITER in caps,
            mount_options=mount_options,
            volume_mount_group=(
                str(args.fs_group) if mount_group_by_driver and args.fs_group is not None else ""
            ),
        )
        try:
            client.node_publish_volume(
                self.volume_handle,
                directory,
                capability,
                staging_target_path=device_mount_path,
                readonly=self.read_only,
                publish_context=publish_context,
                secrets=secrets,
                volume_context=volume_context,
                timeout=ctx.timeout,
            )
        except Exception as exc:
            if is_operation_finished(exc):
                self._cleanup(directory)
            raise
        if not mount_group_by_driver and kubelet_applies_fs_group(
            source, args.fs_group, policy, self.read_only
        ):
            try:
                set_volume_ownership(directory, args.fs_group, args.fs_group_change_policy)
            except OSError as exc:
                # Mounted, but unusable by the pod: uncertain, so that it is cleaned up.
                raise UncertainProgressError(
                    f"applyFSGroup failed for vol {self.volume_handle}: {exc}"
                ) from exc

    def _driver_policy(self) -> tuple[CSIDriverInfo | None, FSGroupPolicy]:
        """The CSIDriver information, checked for the lifecycle mode, and its fsGroup policy."""
        try:
            info = self.ctx.driver_info(self.driver)
        except Exception as exc:
            raise TransientOperationError(
                f"mounter.SetupAt failed to check volume lifecycle mode: {exc}"
            ) from exc
        problem = lifecycle_mode_problem(info, self.lifecycle_mode, self.driver)
        if problem is not None:
            raise TransientOperationError(
                f"mounter.SetupAt failed to check volume lifecycle mode: {problem}"
            )
        try:
            return info, fs_group_policy(info)
        except ValueError as exc:
            raise TransientOperationError(
                f"mounter.SetupAt failed to check fsGroup policy: {exc}"
            ) from exc

    def _persistent_inputs(
        self, client: CSIClient, source: CSIVolumeSource
    ) -> tuple[frozenset[t.NodeCapability] | None, str, dict[str, str] | None]:
        """For a persistent volume: capabilities, staging path (if staged), publish context."""
        if source.ephemeral:
            return None, "", None
        ctx = self.ctx
        try:
            caps = ctx.node_capabilities(client)
        except KubevolError as exc:
            raise OperationError(
                f"mounter.SetUpAt failed to check for STAGE_UNSTAGE_VOLUME capability: {exc}"
            ) from exc
        device_mount_path = ""
        if t.NodeCapability.STAGE_UNSTAGE_VOLUME in caps:
            device_mount_path = paths.device_mount_path(
                ctx.host, source.driver, source.volume_handle
            )
        try:
            publish_context = ctx.publish_context(source)
        except Exception as exc:
            raise TransientOperationError(
                f"mounter.SetUpAt failed to fetch publishContext: {exc}"
            ) from exc
        return caps, device_mount_path, publish_context

    def _publish_inputs(
        self, source: CSIVolumeSource, info: CSIDriverInfo | None, pod: Pod
    ) -> tuple[dict[str, str], dict[str, str]]:
        """NodePublish secrets and the volume context (with pod information when asked)."""
        pod_namespace = str(getattr(pod.metadata, "namespace", "") or "")
        secrets = self.ctx.call_secrets(
            source.node_publish_secret_ref, pod_namespace, "NodePublishSecretRef"
        )
        volume_context = dict(source.volume_attributes)
        if info is not None and info.pod_info_on_mount:
            volume_context.update(pod_info_attributes(pod, self.lifecycle_mode))
        if info is not None and info.token_requests:
            volume_context[SERVICE_ACCOUNT_TOKENS_KEY] = service_account_tokens(
                pod, info.token_requests, self.ctx.host.get_service_account_token_func())
        return secrets, volume_context

    def _record(self, directory: str, selinux: str) -> None:
        """Write vol_data.json beside ``directory``; transient (after cleanup) on failure."""
        node_name = self.ctx.host.get_node_name()
        data = {
            KEY_SPEC_VOL_ID: self.spec_name,
            KEY_VOLUME_HANDLE: self.volume_handle,
            KEY_DRIVER_NAME: self.driver,
            KEY_NODE_NAME: node_name,
            KEY_LIFECYCLE_MODE: self.lifecycle_mode,
            KEY_ATTACHMENT_ID: attachment_name(self.volume_handle, self.driver, node_name),
        }
        if selinux:
            data[KEY_SELINUX_MOUNT_CONTEXT] = selinux
        try:
            save_volume_data(os.path.dirname(directory), data)
        except OSError as exc:
            self._cleanup(directory)
            raise TransientOperationError(
                f"mounter.SetUpAt failed to save volume info data: {exc}"
            ) from exc

    def _cleanup(self, directory: str) -> None:
        try:
            remove_mount_dir(self.ctx.host, directory)
        except OSError as exc:
            log.error("mounter.SetUpAt failed to remove mount dir after error [%s]: %s",
                      directory, exc)

    def tear_down_at(self, directory: str) -> None:
        """NodeUnpublishVolume, then remove the directory, vol_data.json and their parent.

        Transient when the driver is not registered; final when the unpublish fails or
        something is left in the directory (never deleted through a mount).
        """
        client = self.ctx.transient_client(self.driver, "Unmounter.TearDownAt")
        try:
            client.node_unpublish_volume(self.volume_handle, directory, timeout=self.ctx.timeout)
        except KubevolError as exc:
            raise OperationError(f"Unmounter.TearDownAt failed: {exc}") from exc
        # The driver must remove the target path; the kubelet removes its own files (and the
        # target too, should a driver leave it unmounted and empty).
        try:
            remove_mount_dir(self.ctx.host, directory)
        except OSError as exc:
            raise OperationError(
                f"Unmounter.TearDownAt failed to clean mount dir [{directory}]: {exc}"
            ) from exc
