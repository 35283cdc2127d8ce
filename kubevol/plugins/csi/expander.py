"""Volume expansion for the CSI plugin: ControllerExpandVolume and NodeExpandVolume (the
kubelet's ``expander.go``)."""

from __future__ import annotations

from kubevol.csi import types as t
from kubevol.errors import KubevolError, OperationError
from kubevol.plugins.csi.context import CSIContext
from kubevol.plugins.csi.source import FS_TYPE_BLOCK, volume_capability
from kubevol.spec import Spec
from kubevol.types import NodeResizeOptions


def expand_volume_device(ctx: CSIContext, spec: Spec, new_size: int) -> int:
    """ControllerExpandVolume to ``new_size`` bytes when the driver's controller can expand."""
    source = ctx.persistent_source(spec)
    client = ctx.transient_client(source.driver, "Expander.ExpandVolumeDevice")
    try:
        caps = client.controller_get_capabilities(timeout=ctx.timeout)
    except KubevolError as exc:
        raise OperationError(
            f"cannot read controller capabilities of {source.driver}: {exc}"
        ) from exc
    if t.ControllerCapability.EXPAND_VOLUME not in caps:
        return new_size
    secrets = ctx.call_secrets(
        source.controller_expand_secret_ref, "", "ControllerExpandSecretRef"
    )
    try:
        result = client.controller_expand_volume(
            source.volume_handle,
            t.CapacityRange(required_bytes=new_size),
            secrets=secrets,
            timeout=ctx.timeout,
        )
    except KubevolError as exc:
        raise OperationError(
            f"ControllerExpandVolume of {source.volume_handle} failed: {exc}"
        ) from exc
    return result.capacity_bytes or new_size


def node_expand(ctx: CSIContext, options: NodeResizeOptions) -> bool:
    """NodeExpandVolume; True once the driver has grown the volume on the node.

    Transient when the driver is not registered or a secret cannot be read; final when the
    driver lacks the node EXPAND_VOLUME capability (the kubelet's "not supported") or the
    call fails finally; uncertain on a non-final failure.
    """
    source = ctx.persistent_source(options.volume_spec)
    client = ctx.transient_client(source.driver, "Expander.NodeExpand")
    try:
        caps = ctx.node_capabilities(client)
    except KubevolError as exc:
        raise OperationError(
            f"Expander.NodeExpand failed to check if node supports expansion : {exc}"
        ) from exc
    if t.NodeCapability.EXPAND_VOLUME not in caps:
        raise OperationError(f"NodeExpand is not supported by the CSI driver {source.driver}")
    secrets = ctx.call_secrets(source.node_expand_secret_ref, "", "NodeExpandSecretRef")
    volume_path = options.device_path if source.block else options.device_mount_path
    fs_type = FS_TYPE_BLOCK if source.block else source.fs_type
    capability = volume_capability(
        source.access_mode,
        fs_type,
        single_node_multi_writer=t.NodeCapability.SINGLE_NODE_MULTI_WRITER in caps,
        mount_options=source.mount_options,
    )
    try:
        client.node_expand_volume(
            source.volume_handle,
            volume_path,
            capacity_range=t.CapacityRange(required_bytes=options.new_size),
            staging_target_path=options.device_stage_path,
            capability=capability,
            secrets=secrets,
            timeout=ctx.timeout,
        )
    except OperationError:
        raise  # the uncertain variant keeps its meaning
    except KubevolError as exc:
        raise OperationError(f"Expander.NodeExpand failed to expand the volume : {exc}") from exc
    return True
