"""The sharedfs driver's configuration and the capabilities it derives from it."""

from __future__ import annotations

import os

import attrs

from kubevol.csi import types as t
from kubevol.csidriver.drivers.common import DEFAULT_NODE_ID, kubevol_version
from kubevol.csidriver.drivers.engine.records import AccessKind
from kubevol.csidriver.drivers.engine.settings import ALL_MODES, DriverSettings, GiB
from kubevol.csidriver.drivers.sharedfs.location import (
    Filesystem,
    LocationError,
    OnDelete,
    parse_options,
)

DRIVER_NAME = "sharedfs.csi.kubevol.io"

#: Sizes are nominal (a sub-directory has no size of its own): no total is enforced.
NOMINAL_CAPACITY = 1 << 60

CC = t.ControllerCapability
NC = t.NodeCapability


def _absolute(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if not os.path.isabs(value):
        raise ValueError(f"{attr.name} must be an absolute path, got {value!r}")


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attr.name} must be positive, got {value}")


@attrs.frozen(kw_only=True)
class SharedFSConfig:
    """How to run one sharedfs driver.

    ``state_dir`` keeps the driver's records (SQLite, like hostpath's) and its private
    work mounts. ``source``/``fstype``/``mount_options`` name the filesystem of volumes
    whose parameters name none (both or neither of source and fstype). ``on_delete`` is
    what DeleteVolume does unless a volume's ``onDelete`` says otherwise. ``timeout`` bounds
    every call below a mount of the network filesystem (a dead server answers no call; the
    volume is then reported abnormal). ``share_client``: a node stages the second volume of
    a filesystem by binding the root of a staging mount of it this driver already made,
    so that all staging mounts share one client and one device number, as the kernel's
    NFS, CephFS and Lustre clients do on their own (a FUSE client such as GlusterFS's
    would otherwise start one client per volume).
    """

    state_dir: str = attrs.field(validator=_absolute)
    node_id: str = DEFAULT_NODE_ID
    driver_name: str = DRIVER_NAME
    version: str = attrs.field(factory=kubevol_version)
    source: str = ""
    fstype: str = ""
    mount_options: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    on_delete: OnDelete = attrs.field(default=OnDelete.DELETE, converter=OnDelete)
    timeout: float = attrs.field(default=10.0, validator=_positive)
    share_client: bool = True
    default_volume_size: int = GiB

    def __attrs_post_init__(self) -> None:
        if bool(self.source) != bool(self.fstype):
            raise ValueError("source and fstype go together: give both or neither")
        self.default_filesystem()  # validates them

    def default_filesystem(self) -> Filesystem | None:
        """The filesystem of volumes whose parameters name none, if configured."""
        if not self.source:
            return None
        try:
            return Filesystem(
                source=self.source,
                fstype=self.fstype,
                mount_options=parse_options(",".join(self.mount_options)),
            )
        except LocationError as exc:
            raise ValueError(str(exc)) from exc

    def settings(self) -> DriverSettings:
        """Mount volumes in every access mode (a network filesystem is multi-node), staged;
        nominal sizes; no snapshots or clones."""
        return DriverSettings(
            name=self.driver_name,
            version=self.version,
            node_id=self.node_id,
            plugin_services=frozenset({t.PluginServiceType.CONTROLLER_SERVICE}),
            volume_expansion=frozenset({t.VolumeExpansionType.ONLINE}),
            controller_caps=frozenset(
                {
                    CC.CREATE_DELETE_VOLUME,
                    CC.LIST_VOLUMES,
                    CC.GET_CAPACITY,
                    CC.GET_VOLUME,
                    CC.EXPAND_VOLUME,
                    CC.SINGLE_NODE_MULTI_WRITER,
                }
            ),
            node_caps=frozenset(
                {
                    NC.STAGE_UNSTAGE_VOLUME,
                    NC.GET_VOLUME_STATS,
                    NC.VOLUME_CONDITION,
                    NC.EXPAND_VOLUME,
                    NC.SINGLE_NODE_MULTI_WRITER,
                }
            ),
            group_caps=frozenset(),
            access_modes=ALL_MODES,
            kinds=frozenset({AccessKind.MOUNT}),
            capacity_bytes=NOMINAL_CAPACITY,
            max_volume_size=NOMINAL_CAPACITY,
            default_volume_size=self.default_volume_size,
            mutable_parameter_keys=frozenset(),
        )
