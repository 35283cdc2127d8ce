"""What a bundled driver advertises and accepts: its identity, capabilities and limits."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kubevol.csi import types as t
from kubevol.csidriver.drivers.engine.records import AccessKind

GiB = 1 << 30

SINGLE_NODE_MODES: frozenset[t.AccessMode] = frozenset(
    {
        t.AccessMode.SINGLE_NODE_WRITER,
        t.AccessMode.SINGLE_NODE_READER_ONLY,
        t.AccessMode.SINGLE_NODE_SINGLE_WRITER,
        t.AccessMode.SINGLE_NODE_MULTI_WRITER,
    }
)
ALL_MODES: frozenset[t.AccessMode] = frozenset(t.AccessMode) - {t.AccessMode.UNKNOWN}

#: Access modes under which one node may publish a volume at several targets (spec).
MULTI_TARGET_MODES: frozenset[t.AccessMode] = frozenset(
    {
        t.AccessMode.MULTI_NODE_READER_ONLY,
        t.AccessMode.MULTI_NODE_SINGLE_WRITER,
        t.AccessMode.MULTI_NODE_MULTI_WRITER,
        t.AccessMode.SINGLE_NODE_MULTI_WRITER,
    }
)

READ_ONLY_MODES: frozenset[t.AccessMode] = frozenset(
    {t.AccessMode.SINGLE_NODE_READER_ONLY, t.AccessMode.MULTI_NODE_READER_ONLY}
)

MAX_NODE_ID = 256

#: Capabilities whose numbers upstream csi-sanity (v5.3) does not know: its capability checks
#: fail on any value they do not list, so the bundled drivers advertise these only when asked
#: (``GET_SNAPSHOT``, an alpha RPC of CSI 1.11; the alpha snapshot-metadata service is left
#: out of the mock's default plugin services for the same reason).
OPT_IN_CONTROLLER_CAPS: frozenset[t.ControllerCapability] = frozenset(
    {t.ControllerCapability.GET_SNAPSHOT}
)


def _check_node_id(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    if not value or len(value.encode()) > MAX_NODE_ID:
        raise ValueError(f"node id must be 1 to {MAX_NODE_ID} bytes, got {value!r}")


def _positive(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attr.name} must be positive, got {value}")


@attrs.frozen(kw_only=True)
class DriverSettings:
    """Identity, advertised capabilities and limits of one driver instance.

    An RPC whose capability is not listed answers UNIMPLEMENTED. ``max_volumes_per_node``
    is reported by NodeGetInfo and enforced by ControllerPublishVolume (0: no limit).
    ``mutable_parameter_keys`` lists what ControllerModifyVolume accepts (None: any key).
    """

    name: str
    version: str
    node_id: str = attrs.field(validator=_check_node_id)
    manifest: Mapping[str, str] = attrs.field(factory=dict)
    plugin_services: frozenset[t.PluginServiceType] = frozenset(
        {t.PluginServiceType.CONTROLLER_SERVICE, t.PluginServiceType.GROUP_CONTROLLER_SERVICE}
    )
    volume_expansion: frozenset[t.VolumeExpansionType] = frozenset({t.VolumeExpansionType.ONLINE})
    controller_caps: frozenset[t.ControllerCapability] = frozenset()
    node_caps: frozenset[t.NodeCapability] = frozenset()
    group_caps: frozenset[t.GroupControllerCapability] = frozenset()
    access_modes: frozenset[t.AccessMode] = SINGLE_NODE_MODES
    kinds: frozenset[AccessKind] = frozenset(AccessKind)
    capacity_bytes: int = attrs.field(default=1024 * GiB, validator=_positive)
    max_volume_size: int = attrs.field(default=1024 * GiB, validator=_positive)
    default_volume_size: int = attrs.field(default=GiB, validator=_positive)
    max_volumes_per_node: int = 0
    mutable_parameter_keys: frozenset[str] | None = None

    def has_controller(self, cap: t.ControllerCapability) -> bool:
        """Whether the controller capability is advertised."""
        return cap in self.controller_caps

    def has_node(self, cap: t.NodeCapability) -> bool:
        """Whether the node capability is advertised."""
        return cap in self.node_caps

    @property
    def attach_required(self) -> bool:
        """Whether volumes go through ControllerPublishVolume before staging."""
        return self.has_controller(t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME)

    @property
    def staging_required(self) -> bool:
        """Whether NodePublishVolume needs a staged volume."""
        return self.has_node(t.NodeCapability.STAGE_UNSTAGE_VOLUME)
