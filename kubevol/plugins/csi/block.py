"""Raw block CSI volumes (the kubelet's ``csiBlockMapper``).

``set_up_device`` stages at ``volumeDevices/staging/<spec>`` (drivers with STAGE_UNSTAGE),
``map_pod_device`` publishes at ``volumeDevices/publish/<spec>/<podUID>``; vol_data.json
lives in ``volumeDevices/<spec>/data``. :func:`map_block_volume` and
:func:`unmap_block_volume` then do what the kubelet's operation executor does with the
published device: a bind mount at ``volumeDevices/<spec>/dev/<podUID>`` and a link in the
pod's ``volumeDevices/kubernetes.io~csi/<spec>``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.errors import (
    KubevolError,
    OperationError,
    TransientOperationError,
    is_operation_finished,
)
from kubevol.k8s.pod import Pod
from kubevol.layout import validate_path_segment
from kubevol.mount.helpers import remove_tree_on_one_device
from kubevol.plugins.csi import paths
from kubevol.plugins.csi.attach import attachment_name
from kubevol.plugins.csi.context import CSIContext
from kubevol.plugins.csi.metrics import CSIMetrics, PendingMetrics
from kubevol.plugins.csi.source import (
    FS_TYPE_BLOCK,
    CSIVolumeSource,
    volume_capability,
)
from kubevol.plugins.csi.voldata import (
    KEY_ATTACHMENT_ID,
    KEY_DRIVER_NAME,
    KEY_NODE_NAME,
    KEY_SPEC_VOL_ID,
    KEY_VOLUME_HANDLE,
    VolumeDataError,
    load_volume_data,
    require,
    save_volume_data,
    with_context,
)
from kubevol.spec import Spec, pod_uid
from kubevol.volume import (
    CustomBlockVolumeMapper,
    CustomBlockVolumeUnmapper,
    Metrics,
    MetricsProvider,
)

log = logging.getLogger(__name__)


def new_block_mapper(ctx: CSIContext, spec: Spec, pod: Pod) -> CSIBlockMapper:
    """A mapper for a CSI block PersistentVolume; records vol_data.json in the data dir.

    Raises :class:`~kubevol.errors.SpecError` for a non-CSI or inline spec and
    :class:`~kubevol.errors.OperationError` when vol_data.json cannot be written (the data
    directory is then removed).
    """
    source = ctx.persistent_source(spec)
    uid = pod_uid(pod)
    mapper = CSIBlockMapper(
        ctx=ctx, spec_name=spec.name(), pod_uid=uid, driver=source.driver,
        volume_handle=source.volume_handle, read_only=spec.read_only, spec=spec, pod=pod,
    )
    data_dir = paths.block_data_dir(ctx.host, spec.name())
    node = ctx.host.get_node_name()
    data = {
        KEY_SPEC_VOL_ID: spec.name(),
        KEY_VOLUME_HANDLE: source.volume_handle,
        KEY_DRIVER_NAME: source.driver,
        KEY_NODE_NAME: node,
        KEY_ATTACHMENT_ID: attachment_name(source.volume_handle, source.driver, node),
    }
    try:
        os.makedirs(data_dir, mode=0o750, exist_ok=True)
        save_volume_data(data_dir, data)
    except OSError as exc:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise OperationError(f"failed to save volume info data: {exc}") from exc
    return mapper


def new_block_unmapper(ctx: CSIContext, volume_name: str, pod_uid: str) -> CSIBlockMapper:
    """An unmapper from ``volumeDevices/<volume>/data/vol_data.json``; raises
    :class:`~kubevol.plugins.csi.voldata.VolumeDataError` when it is missing or corrupt."""
    data_dir = paths.block_data_dir(ctx.host, volume_name)
    try:
        data = load_volume_data(data_dir)
        driver, handle = require(data, data_dir, KEY_DRIVER_NAME, KEY_VOLUME_HANDLE)
    except VolumeDataError as exc:
        raise with_context(exc, (
            f"unmapper failed to load volume data file [{data_dir}]"
        )) from exc
    return CSIBlockMapper(
        ctx=ctx, spec_name=volume_name, pod_uid=pod_uid, driver=driver,
        volume_handle=handle, read_only=False, spec=None, pod=None,
    )


class CSIBlockMapper(CustomBlockVolumeMapper, CustomBlockVolumeUnmapper, MetricsProvider):
    """Stages and publishes (and undoes both for) one block volume of one pod, and
    measures it."""

    def __init__(
        self,
        *,
        ctx: CSIContext,
        spec_name: str,
        pod_uid: str,
        driver: str,
        volume_handle: str,
        read_only: bool,
        spec: Spec | None,
        pod: Pod | None,
    ) -> None:
        self.ctx = ctx
        self.spec_name = spec_name
        self.pod_uid = pod_uid
        self.driver = driver
        self.volume_handle = volume_handle
        self.read_only = read_only
        self.spec = spec
        self.pod = pod
        host = ctx.host
        self._staging = paths.block_staging_path(host, spec_name)

    # --- paths ----------------------------------------------------------------------

    def get_global_map_path(self, spec: Spec) -> str:
        return paths.block_global_map_path(self.ctx.host, spec.name())

    def get_pod_device_map_path(self) -> tuple[str, str]:
        return (
            self.ctx.host.get_pod_volume_device_dir(self.pod_uid, paths.CSI_PLUGIN_NAME),
            self.spec_name,
        )

    def get_staging_path(self) -> str:
        return self._staging

    def get_publish_path(self) -> str:
        """``volumeDevices/publish/<spec>/<podUID>``. Computed on use: tearing the device
        down concerns no pod, and the kubelet then passes an empty pod UID."""
        return paths.block_publish_path(self.ctx.host, self.spec_name, self.pod_uid)

    def get_metrics_path(self) -> str:
        """``volumeDevices/<spec>/dev/<podUID>``: the pod's bind of the device under the
        global map path, where the kubelet asks for a block volume's stats (its
        ``NewMetricsCsi(handle, blockPath+"/"+podUID, driver)``, kubernetes#97972)."""
        return os.path.join(
            paths.block_global_map_path(self.ctx.host, self.spec_name),
            validate_path_segment(self.pod_uid, "pod UID"),
        )

    def get_metrics(self) -> Metrics:
        """NodeGetVolumeStats on :meth:`get_metrics_path` (the driver reports the device's
        capacity there; used and inodes may be left out, and then read 0)."""
        return self._metrics().get_metrics()

    def metrics_starter(self) -> Callable[[], PendingMetrics] | None:
        """See :meth:`CSIMetrics.metrics_starter`."""
        return self._metrics().metrics_starter()

    def _metrics(self) -> CSIMetrics:
        return CSIMetrics(
            ctx=self.ctx, driver=self.driver, volume_id=self.volume_handle,
            target_path=self.get_metrics_path(),
        )

    # --- set up ---------------------------------------------------------------------

    def _prepare(self, where: str) -> tuple[CSIVolumeSource, CSIClient, dict[str, str] | None]:
        if self.spec is None:
            raise OperationError(f"{where}: this is an unmapper (no spec)")
        source = self.ctx.persistent_source(self.spec)
        try:
            publish_context = self.ctx.publish_context(source)
        except Exception as exc:
            raise TransientOperationError(f"{where} failed to get publish context: {exc}") from exc
        client = self.ctx.transient_client(self.driver, where)
        return source, client, publish_context

    def _capability(
        self, source: CSIVolumeSource, caps: frozenset[t.NodeCapability]
    ) -> t.VolumeCapability:
        return volume_capability(
            source.access_mode, FS_TYPE_BLOCK,
            single_node_multi_writer=t.NodeCapability.SINGLE_NODE_MULTI_WRITER in caps,
        )

    def _secrets(self, source: CSIVolumeSource, which: str) -> dict[str, str]:
        ref = source.node_stage_secret_ref if which == "stage" else source.node_publish_secret_ref
        namespace = str(getattr(getattr(self.pod, "metadata", None), "namespace", "") or "")
        what = "NodeStageSecretRef" if which == "stage" else "NodePublishSecretRef"
        return self.ctx.call_secrets(ref, namespace, what, OperationError)

    def set_up_device(self) -> str:
        """NodeStageVolume at the staging path when the driver stages; returns that path
        (``""`` for a driver without STAGE_UNSTAGE). A final failure removes the files the
        mapper made."""
        source, client, publish_context = self._prepare("blockMapper.SetUpDevice")
        try:
            caps = self.ctx.node_capabilities(client)
        except KubevolError as exc:
            raise OperationError(
                f"blockMapper.stageVolumeForBlock failed to check STAGE_UNSTAGE_VOLUME: {exc}"
            ) from exc
        if t.NodeCapability.STAGE_UNSTAGE_VOLUME not in caps:
            return ""
        try:
            secrets = self._secrets(source, "stage")
            os.makedirs(self._staging, mode=0o750, exist_ok=True)
            client.node_stage_volume(
                self.volume_handle, self._staging, self._capability(source, caps),
                publish_context=publish_context, secrets=secrets,
                volume_context=source.volume_attributes, timeout=self.ctx.timeout,
            )
        except Exception as exc:
            if is_operation_finished(exc):
                self._cleanup_orphan_device_files()
            raise
        return self._staging

    def map_pod_device(self) -> str:
        """NodePublishVolume at ``volumeDevices/publish/<spec>/<podUID>`` (parent created
        here, the path itself by the driver); returns that path."""
        source, client, publish_context = self._prepare("blockMapper.MapPodDevice")
        try:
            caps = self.ctx.node_capabilities(client)
        except KubevolError as exc:
            raise OperationError(
                f"blockMapper.MapPodDevice failed to get capabilities: {exc}"
            ) from exc
        staging = self._staging if t.NodeCapability.STAGE_UNSTAGE_VOLUME in caps else ""
        secrets = self._secrets(source, "publish")
        publish = self.get_publish_path()
        try:
            os.makedirs(os.path.dirname(publish), mode=0o750, exist_ok=True)
        except OSError as exc:
            raise OperationError(
                f"blockMapper.publishVolumeForBlock failed to create dir: {exc}"
            ) from exc
        client.node_publish_volume(
            self.volume_handle, publish, self._capability(source, caps),
            staging_target_path=staging, readonly=self.read_only,
            publish_context=publish_context, secrets=secrets,
            volume_context=source.volume_attributes, timeout=self.ctx.timeout,
        )
        return publish

    # --- tear down ------------------------------------------------------------------

    def unmap_pod_device(self) -> None:
        """NodeUnpublishVolume of the publish path, if it still exists."""
        client = self.ctx.transient_client(self.driver, "blockMapper.UnmapPodDevice")
        publish = self.get_publish_path()
        if not os.path.lexists(publish):
            log.info("publish path %s already gone, skipping NodeUnpublishVolume", publish)
            return
        try:
            client.node_unpublish_volume(self.volume_handle, publish, timeout=self.ctx.timeout)
        except KubevolError as exc:
            raise OperationError(f"blockMapper.unpublishVolumeForBlock failed: {exc}") from exc

    def tear_down_device(self, map_path: str, device_path: str) -> None:
        """NodeUnstageVolume of the staging path (if it exists and the driver stages), then
        remove the mapper's directories and vol_data.json."""
        client = self.ctx.transient_client(self.driver, "blockMapper.TearDownDevice")
        if os.path.lexists(self._staging):
            try:
                caps = self.ctx.node_capabilities(client)
                if t.NodeCapability.STAGE_UNSTAGE_VOLUME in caps:
                    client.node_unstage_volume(self.volume_handle, self._staging,
                                               timeout=self.ctx.timeout)
            except KubevolError as exc:
                raise OperationError(f"blockMapper.unstageVolumeForBlock failed: {exc}") from exc
        self._cleanup_orphan_device_files()

    def _cleanup_orphan_device_files(self) -> None:
        """Remove publish/<spec>, staging/<spec> and volumeDevices/<spec> once empty of
        mounts; problems are logged, as the kubelet does."""
        host = self.ctx.host
        for path in (paths.block_publish_dir(host, self.spec_name), self._staging):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove %s: %s", path, exc)
        volume_dir = paths.block_volume_dir(host, self.spec_name)
        try:
            _remove_all_one_filesystem(volume_dir)
        except OSError as exc:
            log.warning("cannot remove %s: %s", volume_dir, exc)


def _remove_all_one_filesystem(path: str) -> None:
    """Delete ``path`` recursively, refusing (before deleting anything) when a mount lies
    below it. Absent is fine."""
    if not os.path.lexists(path):
        return
    remove_tree_on_one_device(path)
