"""The hostpath driver's configuration and the capabilities it derives from it."""

from __future__ import annotations

import os

import attrs

from kubevol.csi import types as t
from kubevol.csidriver.drivers.common import DEFAULT_NODE_ID, kubevol_version
from kubevol.csidriver.drivers.engine.records import AccessKind
from kubevol.csidriver.drivers.engine.settings import (
    ALL_MODES,
    SINGLE_NODE_MODES,
    DriverSettings,
    GiB,
)

DRIVER_NAME = "hostpath.csi.kubevol.io"

CC = t.ControllerCapability
NC = t.NodeCapability


def _absolute(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not os.path.isabs(value):
        raise ValueError(f"{attr.name} must be an absolute path, got {value!r}")


def _optional_absolute(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value:
        _absolute(_inst, attr, value)


def _not_negative(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attr.name} must not be negative, got {value}")


@attrs.frozen(kw_only=True)
class HostPathConfig:
    """How to run one hostpath driver.

    Volumes live under ``state_dir`` (directories for mount access, sparse image files on
    loop devices for block access), or, with ``shared_filesystem`` set to an image path,
    as sub-directories of one ext4 filesystem on one loop device (the image is created with
    ``shared_filesystem_size`` bytes when it does not exist). ``capacity_bytes`` is what
    volumes may use in total; on a shared filesystem sizes are nominal, like quotas (the
    volumes share the filesystem's space, as on Lustre). ``enable_attach``
    adds ControllerPublish/Unpublish, with at most ``attach_limit`` volumes per node
    (0: no limit). ``get_snapshot`` advertises the alpha GetSnapshot RPC, which upstream
    csi-sanity does not know (off by default, like the upstream hostpath driver).
    """

    state_dir: str = attrs.field(validator=_absolute)
    node_id: str = DEFAULT_NODE_ID
    driver_name: str = DRIVER_NAME
    version: str = attrs.field(factory=kubevol_version)
    capacity_bytes: int = 100 * GiB
    max_volume_size: int = 0
    default_volume_size: int = GiB
    enable_attach: bool = False
    attach_limit: int = attrs.field(default=0, validator=_not_negative)
    shared_filesystem: str = attrs.field(default="", validator=_optional_absolute)
    shared_filesystem_size: int = GiB
    get_snapshot: bool = False

    def settings(self) -> DriverSettings:
        """The engine settings: capabilities per the issue's list, limits from the config."""
        controller = {
            CC.CREATE_DELETE_VOLUME,
            CC.LIST_VOLUMES,
            CC.GET_CAPACITY,
            CC.CREATE_DELETE_SNAPSHOT,
            CC.LIST_SNAPSHOTS,
            CC.CLONE_VOLUME,
            CC.EXPAND_VOLUME,
            CC.GET_VOLUME,
            CC.VOLUME_CONDITION,
            CC.SINGLE_NODE_MULTI_WRITER,
        }
        if self.get_snapshot:
            controller.add(CC.GET_SNAPSHOT)
        if self.enable_attach:
            controller |= {
                CC.PUBLISH_UNPUBLISH_VOLUME,
                CC.PUBLISH_READONLY,
                CC.LIST_VOLUMES_PUBLISHED_NODES,
            }
        capacity = self.capacity_bytes
        shared = bool(self.shared_filesystem)
        return DriverSettings(
            name=self.driver_name,
            version=self.version,
            node_id=self.node_id,
            controller_caps=frozenset(controller),
            node_caps=frozenset(
                {
                    NC.STAGE_UNSTAGE_VOLUME,
                    NC.GET_VOLUME_STATS,
                    NC.VOLUME_CONDITION,
                    NC.EXPAND_VOLUME,
                    NC.SINGLE_NODE_MULTI_WRITER,
                }
            ),
            group_caps=frozenset(
                {t.GroupControllerCapability.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}
            ),
            # A shared filesystem is what multi-node filesystems look like on one node.
            access_modes=ALL_MODES if shared else SINGLE_NODE_MODES,
            kinds=frozenset({AccessKind.MOUNT}) if shared else frozenset(AccessKind),
            capacity_bytes=capacity,
            max_volume_size=min(self.max_volume_size or capacity, capacity),
            default_volume_size=min(self.default_volume_size, capacity),
            max_volumes_per_node=self.attach_limit if self.enable_attach else 0,
            mutable_parameter_keys=frozenset(),
        )
