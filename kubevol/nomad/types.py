"""Data the CSI plugin manager reports and accepts (Nomad's ``CSIInfo``, ``UsageOptions``,
``CSIVolume``, ``MountInfo``, ``NodeEvent``), as frozen attrs types."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping

import attrs

from kubevol.csi import types as t
from kubevol.layout import validate_path_segment


def _frozen_map(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return dict(value or {})


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _segment(what: str) -> Callable[[object, attrs.Attribute[str], str], None]:
    def check(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
        validate_path_segment(value, what)

    return check


# --- fingerprints -------------------------------------------------------------------


class HealthState(enum.StrEnum):
    """A plugin's health as the manager last saw it."""

    #: The plugin never answered a fingerprint (not "detected", unlike Nomad's old log).
    UNDETECTED = "undetected"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@attrs.frozen(kw_only=True)
class NodeFingerprint:
    """What a node plugin said about this node and its node service."""

    node_id: str = ""
    max_volumes: int = 0
    accessible_topology: t.Topology | None = None
    capabilities: frozenset[t.NodeCapability] = frozenset()

    @property
    def requires_node_stage_volume(self) -> bool:
        """Whether volumes must be staged (STAGE_UNSTAGE_VOLUME)."""
        return t.NodeCapability.STAGE_UNSTAGE_VOLUME in self.capabilities

    @property
    def supports_stats(self) -> bool:
        """Whether NodeGetVolumeStats is served."""
        return t.NodeCapability.GET_VOLUME_STATS in self.capabilities

    @property
    def supports_expand(self) -> bool:
        """Whether NodeExpandVolume is served."""
        return t.NodeCapability.EXPAND_VOLUME in self.capabilities

    @property
    def supports_condition(self) -> bool:
        """Whether NodeGetVolumeStats reports a volume condition."""
        return t.NodeCapability.VOLUME_CONDITION in self.capabilities


@attrs.frozen(kw_only=True)
class ControllerFingerprint:
    """What a controller plugin said about its controller service."""

    capabilities: frozenset[t.ControllerCapability] = frozenset()

    def supports(self, capability: t.ControllerCapability) -> bool:
        """Whether the controller advertised ``capability``."""
        return capability in self.capabilities


@attrs.frozen(kw_only=True)
class CSIInfo:
    """One fingerprint of a plugin instance (Nomad's ``structs.CSIInfo``).

    ``node_info`` is set for ``csi-node`` plugins once NodeGetInfo answered;
    ``controller_info`` for ``csi-controller`` plugins once ControllerGetCapabilities did.
    ``update_time`` is wall-clock seconds, for display only.
    """

    plugin_id: str
    plugin_type: str
    alloc_id: str
    provider: str = ""
    provider_version: str = ""
    health: HealthState = HealthState.UNDETECTED
    health_description: str = ""
    requires_controller_plugin: bool = False
    requires_topologies: bool = False
    node_info: NodeFingerprint | None = None
    controller_info: ControllerFingerprint | None = None
    update_time: float = attrs.field(factory=time.time)

    @property
    def healthy(self) -> bool:
        """True only for :attr:`HealthState.HEALTHY`."""
        return self.health is HealthState.HEALTHY


@attrs.frozen(kw_only=True)
class NodeEvent:
    """Something the node agent should record (Nomad's ``structs.NodeEvent``)."""

    subsystem: str
    message: str
    details: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)
    timestamp: float = attrs.field(factory=time.time)


#: Receives every fingerprint of a plugin: (plugin name, info).
UpdateNodeCSIInfoFunc = Callable[[str, CSIInfo], None]
#: Receives node events: health transitions, mount and unmount results.
TriggerNodeEvent = Callable[[NodeEvent], None]


# --- volumes ------------------------------------------------------------------------


class AttachmentMode(enum.StrEnum):
    """How an allocation uses a volume."""

    FILE_SYSTEM = "file-system"
    BLOCK_DEVICE = "block-device"


class AccessMode(enum.StrEnum):
    """Who may use a volume at once (Nomad's names for the CSI access modes)."""

    SINGLE_NODE_READER_ONLY = "single-node-reader-only"
    SINGLE_NODE_WRITER = "single-node-writer"
    SINGLE_NODE_SINGLE_WRITER = "single-node-single-writer"
    SINGLE_NODE_MULTI_WRITER = "single-node-multi-writer"
    MULTI_NODE_READER_ONLY = "multi-node-reader-only"
    MULTI_NODE_SINGLE_WRITER = "multi-node-single-writer"
    MULTI_NODE_MULTI_WRITER = "multi-node-multi-writer"

    def to_csi(self) -> t.AccessMode:
        """The CSI wire access mode."""
        return t.AccessMode[self.name]


@attrs.frozen(kw_only=True)
class MountOptions:
    """Filesystem type and mount flags for a file-system volume."""

    fs_type: str = ""
    mount_flags: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)

    def merged(self, override: MountOptions | None) -> MountOptions:
        """These options with ``override``'s: its fs_type wins when set, flags are added."""
        if override is None:
            return self
        flags = list(self.mount_flags)
        flags += [f for f in override.mount_flags if f not in flags]
        return MountOptions(fs_type=override.fs_type or self.fs_type, mount_flags=tuple(flags))


@attrs.frozen(kw_only=True)
class UsageOptions:
    """How one allocation uses a volume; :meth:`to_fs` names its staging and target dirs.

    ``mount_options`` do not take part in :meth:`to_fs` nor in usage tracking, so an
    unmount that omits them still finds the claim (a pitfall of Nomad's tracker key).
    """

    read_only: bool = False
    attachment_mode: AttachmentMode = attrs.field(
        default=AttachmentMode.FILE_SYSTEM, converter=AttachmentMode
    )
    access_mode: AccessMode = attrs.field(
        default=AccessMode.SINGLE_NODE_WRITER, converter=AccessMode
    )
    mount_options: MountOptions | None = None

    def to_fs(self) -> str:
        """``ro|rw-<attachment mode>-<access mode>``: lowercase letters and dashes only,
        starting with a letter, so it is always a safe path segment."""
        return "-".join(
            ("ro" if self.read_only else "rw", self.attachment_mode.value, self.access_mode.value)
        )

    @classmethod
    def from_fs(cls, text: str) -> UsageOptions:
        """Parse :meth:`to_fs` output. Raises ``ValueError`` naming ``text`` otherwise."""
        mode, _, rest = text.partition("-")
        if mode in ("ro", "rw"):
            for attachment in AttachmentMode:
                prefix = attachment.value + "-"
                if rest.startswith(prefix):
                    try:
                        access = AccessMode(rest[len(prefix) :])
                    except ValueError:
                        break
                    return cls(
                        read_only=mode == "ro", attachment_mode=attachment, access_mode=access
                    )
        raise ValueError(f"{text!r} is not a volume usage directory name (ro|rw-<attach>-<access>)")

    def capability(self, volume_options: MountOptions | None = None) -> t.VolumeCapability:
        """The CSI volume capability for this usage, with ``volume_options`` merged under
        this usage's mount options."""
        access = self.access_mode.to_csi()
        if self.attachment_mode is AttachmentMode.BLOCK_DEVICE:
            return t.VolumeCapability.block(access)
        opts = (volume_options or MountOptions()).merged(self.mount_options)
        return t.VolumeCapability.mount(access, opts.fs_type, opts.mount_flags)


@attrs.frozen(kw_only=True)
class CSIVolume:
    """A volume to mount: ``id`` (a path segment) in ``namespace``; ``remote_id`` is the
    storage provider's id sent to the plugin (``id`` when empty). ``secrets`` never appear
    in ``repr``."""

    id: str = attrs.field(validator=_segment("volume id"))
    namespace: str = attrs.field(default="default", validator=_segment("volume namespace"))
    remote_id: str = ""
    plugin_id: str = ""
    context: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)
    secrets: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map, repr=False)
    mount_options: MountOptions | None = None

    @property
    def external_id(self) -> str:
        """The id the plugin knows the volume by."""
        return self.remote_id or self.id


@attrs.frozen(kw_only=True)
class MountInfo:
    """Where a mounted volume is on the host: ``source`` is the published target path."""

    source: str
    is_device: bool = False
