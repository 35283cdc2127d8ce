"""Argument and attribute types passed across the plugin bases (Kubernetes' argument structs)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from kubernetes.client import V1PersistentVolumeClaim, V1Pod

    from kubevol.spec import Spec

#: StorageClass parameter naming the filesystem a provisioner should create.
VOLUME_PARAMETER_FS_TYPE = "fstype"


class CSIVolumePhase(enum.StrEnum):
    """Where a CSI volume is on the node when it is expanded."""

    STAGED = "staged"
    PUBLISHED = "published"


#: The CSI volume phases under Kubernetes' constant names.
CSI_VOLUME_STAGED = CSIVolumePhase.STAGED
CSI_VOLUME_PUBLISHED = CSIVolumePhase.PUBLISHED


class FSGroupChangePolicy(enum.StrEnum):
    """A pod's ``fsGroupChangePolicy``."""

    ON_ROOT_MISMATCH = "OnRootMismatch"
    ALWAYS = "Always"


@attrs.frozen(kw_only=True)
class MounterArgs:
    """What ``Mounter.set_up`` needs besides the volume: ownership and size wishes of the pod."""

    fs_user: int | None = None
    fs_group: int | None = None
    fs_group_change_policy: FSGroupChangePolicy | None = None
    desired_size: int | None = None
    selinux_label: str = ""


@attrs.frozen(kw_only=True)
class DeviceMounterArgs:
    """What ``DeviceMounter.mount_device`` needs besides the paths."""

    fs_group: int | None = None
    selinux_label: str = ""


@attrs.frozen(kw_only=True)
class Attributes:
    """What a mounter tells about the volume it set up."""

    read_only: bool = False
    managed: bool = True
    selinux_relabel: bool = False


@attrs.frozen(kw_only=True)
class VolumeOptions:
    """Options for provisioning or mounting a volume.

    ``pvc`` is a ``kubernetes.client.V1PersistentVolumeClaim`` when set.
    """

    persistent_volume_reclaim_policy: str = "Delete"
    mount_options: tuple[str, ...] = ()
    pv_name: str = ""
    pvc: V1PersistentVolumeClaim | None = None
    cluster_name: str = ""
    cloud_tags: dict[str, str] | None = None
    parameters: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class VolumeConfig:
    """Configuration handed to a plugin by the binary that hosts it.

    ``recycler_pod_template`` is a ``kubernetes.client.V1Pod`` when set.
    """

    recycler_pod_template: V1Pod | None = None
    recycler_minimum_timeout: int = 60
    recycler_timeout_increment: int = 30
    pv_name: str = ""
    other_attributes: dict[str, str] = attrs.field(factory=dict)
    provisioning_enabled: bool = False


@attrs.frozen(kw_only=True)
class NodeResizeOptions:
    """What a node-side expansion needs. Sizes are in bytes."""

    volume_spec: Spec
    device_path: str = ""
    device_mount_path: str = ""
    device_stage_path: str = ""
    new_size: int
    old_size: int
    csi_volume_phase: CSIVolumePhase | None = None


@attrs.frozen(kw_only=True)
class ReconstructedVolume:
    """What ``construct_volume_spec`` rebuilt from disk."""

    spec: Spec
    selinux_mount_context: str = ""
