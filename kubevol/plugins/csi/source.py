"""What a ``Spec`` says about a CSI volume, read into attrs (the kubelet's
``getSourceFromSpec`` and the fields its CSI code reads). ``CSIPlugin.source`` keeps the
result per Spec, and ``CSIPlugin.persistent_source`` is ``getPVSourceFromSpec``.

A PersistentVolume with ``spec.csi`` is a *persistent* volume; a pod volume with ``csi``
is an *ephemeral* inline volume whose handle is derived from the pod UID.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from kubevol.csi import types as t
from kubevol.errors import SpecError
from kubevol.plugins.csi.driverinfo import LIFECYCLE_EPHEMERAL, LIFECYCLE_PERSISTENT
from kubevol.spec import Spec

if TYPE_CHECKING:
    from kubernetes.client import V1LocalObjectReference, V1SecretReference

READ_WRITE_ONCE = "ReadWriteOnce"
READ_ONLY_MANY = "ReadOnlyMany"
READ_WRITE_MANY = "ReadWriteMany"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"

#: The key under which a Spec keeps its :func:`csi_source` (:meth:`kubevol.spec.Spec.derived`).
SOURCE_KEY = "kubernetes.io/csi:source"

#: Kubernetes' ``fsTypeBlockName``: the fsType the kubelet passes for raw block access.
FS_TYPE_BLOCK = "block"


@attrs.frozen(kw_only=True)
class SecretRef:
    """A Secret to read credentials from; an empty namespace means the pod's."""

    namespace: str
    name: str


@attrs.frozen(kw_only=True)
class CSIVolumeSource:
    """The CSI fields of a Spec. ``volume_handle`` is empty for inline volumes."""

    spec_name: str
    driver: str
    volume_handle: str
    lifecycle_mode: str
    fs_type: str = ""
    read_only: bool = False
    volume_attributes: Mapping[str, str] = attrs.field(factory=dict)
    access_modes: tuple[str, ...] = ()
    mount_options: tuple[str, ...] = ()
    block: bool = False
    pv_name: str = ""
    node_stage_secret_ref: SecretRef | None = None
    node_publish_secret_ref: SecretRef | None = None
    controller_publish_secret_ref: SecretRef | None = None
    node_expand_secret_ref: SecretRef | None = None
    controller_expand_secret_ref: SecretRef | None = None

    @property
    def ephemeral(self) -> bool:
        """Whether this is an inline ephemeral volume."""
        return self.lifecycle_mode == LIFECYCLE_EPHEMERAL

    @property
    def access_mode(self) -> str:
        """The first PV access mode, ``ReadWriteOnce`` when none is given (the kubelet's rule)."""
        return self.access_modes[0] if self.access_modes else READ_WRITE_ONCE


def is_csi_spec(spec: Spec | None) -> bool:
    """Whether ``spec`` is a CSI PersistentVolume or a CSI inline volume. Never raises."""
    if spec is None:
        return False
    if spec.persistent_volume is not None:
        pv_spec = getattr(spec.persistent_volume, "spec", None)
        return getattr(pv_spec, "csi", None) is not None
    return getattr(spec.volume, "csi", None) is not None


def reconstructed_source(
    spec_name: str, driver: str, volume_handle: str, *, ephemeral: bool = False,
    block: bool = False,
) -> CSIVolumeSource:
    """What :func:`csi_source` reads from the Spec reconstruction rebuilds out of a
    ``vol_data.json`` (:func:`reconstructed_spec`), without building its model."""
    if ephemeral:
        return CSIVolumeSource(
            spec_name=spec_name, driver=driver, volume_handle="",
            lifecycle_mode=LIFECYCLE_EPHEMERAL,
        )
    return CSIVolumeSource(
        spec_name=spec_name, driver=driver, volume_handle=volume_handle,
        lifecycle_mode=LIFECYCLE_PERSISTENT, block=block, pv_name=spec_name,
    )


def reconstructed_spec(
    spec_name: str, driver: str, volume_handle: str, *, ephemeral: bool = False,
    block: bool = False,
) -> Spec:
    """The Spec the kubelet rebuilds from ``vol_data.json``: an inline ``csi`` pod volume
    when ``ephemeral``, else a PersistentVolume (``Block`` mode when ``block``), its model
    deferred and its source (:func:`reconstructed_source`) known."""
    known = {SOURCE_KEY: reconstructed_source(
        spec_name, driver, volume_handle, ephemeral=ephemeral, block=block
    )}
    if ephemeral:
        return Spec.from_api_data(
            volume={"name": spec_name, "csi": {"driver": driver}}, known=known
        )
    return Spec.from_api_data(persistent_volume={
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": spec_name},
        "spec": {"csi": {"driver": driver, "volumeHandle": volume_handle},
                 "volumeMode": "Block" if block else "Filesystem"},
    }, known=known)


def _secret(
    ref: V1SecretReference | V1LocalObjectReference | None, *, namespaced: bool
) -> SecretRef | None:
    if ref is None or not getattr(ref, "name", None):
        return None
    namespace = str(getattr(ref, "namespace", "") or "") if namespaced else ""
    return SecretRef(namespace=namespace, name=str(ref.name))


def csi_source(spec: Spec) -> CSIVolumeSource:
    """Read the CSI fields of ``spec``.

    Raises :class:`~kubevol.errors.SpecError` when ``spec`` is not a CSI volume or names
    no driver (or, for a PersistentVolume, no volume handle).
    """
    if spec.persistent_volume is not None:
        pv = spec.persistent_volume
        pv_spec = getattr(pv, "spec", None)
        src = getattr(pv_spec, "csi", None)
        if pv_spec is None or src is None:
            raise SpecError(f"PersistentVolume {spec.name()!r} is not a CSI volume (no spec.csi)")
        if not src.driver:
            raise SpecError(f"PersistentVolume {spec.name()!r} has an empty spec.csi.driver")
        if not src.volume_handle:
            raise SpecError(f"PersistentVolume {spec.name()!r} has an empty spec.csi.volumeHandle")
        return CSIVolumeSource(
            spec_name=spec.name(),
            driver=str(src.driver),
            volume_handle=str(src.volume_handle),
            lifecycle_mode=LIFECYCLE_PERSISTENT,
            fs_type=str(src.fs_type or ""),
            read_only=spec.read_only,
            volume_attributes=dict(src.volume_attributes or {}),
            access_modes=tuple(pv_spec.access_modes or ()),
            mount_options=tuple(pv_spec.mount_options or ()),
            block=(pv_spec.volume_mode == "Block"),
            pv_name=spec.name(),
            node_stage_secret_ref=_secret(src.node_stage_secret_ref, namespaced=True),
            node_publish_secret_ref=_secret(src.node_publish_secret_ref, namespaced=True),
            controller_publish_secret_ref=_secret(
                src.controller_publish_secret_ref, namespaced=True
            ),
            node_expand_secret_ref=_secret(
                getattr(src, "node_expand_secret_ref", None), namespaced=True
            ),
            controller_expand_secret_ref=_secret(src.controller_expand_secret_ref, namespaced=True),
        )
    src = getattr(spec.volume, "csi", None)
    if src is None:
        raise SpecError(f"volume {spec.name()!r} is not a CSI volume (no csi source)")
    if not src.driver:
        raise SpecError(f"volume {spec.name()!r} has an empty csi.driver")
    return CSIVolumeSource(
        spec_name=spec.name(),
        driver=str(src.driver),
        volume_handle="",
        lifecycle_mode=LIFECYCLE_EPHEMERAL,
        fs_type=str(src.fs_type or ""),
        read_only=bool(src.read_only),
        volume_attributes=dict(src.volume_attributes or {}),
        node_publish_secret_ref=_secret(src.node_publish_secret_ref, namespaced=False),
    )


# --- access modes -------------------------------------------------------------------

_ACCESS_MODES: Mapping[str, t.AccessMode] = {
    READ_WRITE_ONCE: t.AccessMode.SINGLE_NODE_WRITER,
    READ_ONLY_MANY: t.AccessMode.MULTI_NODE_READER_ONLY,
    READ_WRITE_MANY: t.AccessMode.MULTI_NODE_MULTI_WRITER,
    # Lets drivers without SINGLE_NODE_MULTI_WRITER serve ReadWriteOncePod volumes.
    READ_WRITE_ONCE_POD: t.AccessMode.SINGLE_NODE_WRITER,
}

_SNMW_ACCESS_MODES: Mapping[str, t.AccessMode] = {
    READ_WRITE_ONCE: t.AccessMode.SINGLE_NODE_MULTI_WRITER,
    READ_ONLY_MANY: t.AccessMode.MULTI_NODE_READER_ONLY,
    READ_WRITE_MANY: t.AccessMode.MULTI_NODE_MULTI_WRITER,
    READ_WRITE_ONCE_POD: t.AccessMode.SINGLE_NODE_SINGLE_WRITER,
}


def csi_access_mode(access_mode: str, *, single_node_multi_writer: bool) -> t.AccessMode:
    """The CSI access mode for a Kubernetes one; ``UNKNOWN`` for an unknown mode.

    With ``single_node_multi_writer`` (the driver advertises SINGLE_NODE_MULTI_WRITER),
    ReadWriteOnce maps to SINGLE_NODE_MULTI_WRITER and ReadWriteOncePod to
    SINGLE_NODE_SINGLE_WRITER, as the kubelet maps them.
    """
    table = _SNMW_ACCESS_MODES if single_node_multi_writer else _ACCESS_MODES
    return table.get(access_mode, t.AccessMode.UNKNOWN)


def volume_capability(
    access_mode: str,
    fs_type: str,
    *,
    single_node_multi_writer: bool,
    mount_options: tuple[str, ...] = (),
    volume_mount_group: str = "",
) -> t.VolumeCapability:
    """The capability the kubelet sends: block access for fsType ``block``, else mount."""
    mode = csi_access_mode(access_mode, single_node_multi_writer=single_node_multi_writer)
    if fs_type == FS_TYPE_BLOCK:
        return t.VolumeCapability(access_mode=mode, access_type=t.BlockAccess())
    return t.VolumeCapability(
        access_mode=mode,
        access_type=t.MountAccess(
            fs_type=fs_type, mount_flags=mount_options, volume_mount_group=volume_mount_group
        ),
    )
