"""What a bundled driver remembers: volumes, snapshots, group snapshots, and where each
volume is attached, staged and published. Records are frozen; the engine replaces them.

Every record converts to and from a JSON-friendly dict, so a state store can persist it
(``to_json`` / ``*_from_json``); unknown keys are ignored on load.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from typing import Any

import attrs

from kubevol.csi import types as t


class AccessKind(enum.StrEnum):
    """Whether a volume is a filesystem (``mount``) or a raw device (``block``)."""

    MOUNT = "mount"
    BLOCK = "block"

    @classmethod
    def of(cls, capability: t.VolumeCapability) -> AccessKind:
        """The kind a capability asks for."""
        return cls.BLOCK if isinstance(capability.access_type, t.BlockAccess) else cls.MOUNT


@attrs.frozen(kw_only=True)
class Attachment:
    """A ControllerPublishVolume of the volume to ``node_id``."""

    node_id: str
    readonly: bool
    capability: t.VolumeCapability


@attrs.frozen(kw_only=True)
class Staging:
    """A NodeStageVolume at ``path``; ``device`` is the loop device backing it, if any."""

    path: str
    capability: t.VolumeCapability
    device: str = ""


@attrs.frozen(kw_only=True)
class Publication:
    """A NodePublishVolume at ``target_path``."""

    target_path: str
    staging_path: str
    readonly: bool
    capability: t.VolumeCapability


def _strings(value: Mapping[str, str] | None) -> dict[str, str]:
    return dict(value or {})


def _attachments(value: Mapping[str, Attachment] | None) -> dict[str, Attachment]:
    return dict(value or {})


def _publications(value: Mapping[str, Publication] | None) -> dict[str, Publication]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class VolumeRecord:
    """A volume; ``attachments`` by node id, ``publications`` by target path."""

    volume_id: str
    name: str
    capacity_bytes: int
    kind: AccessKind
    parameters: Mapping[str, str] = attrs.field(factory=dict, converter=_strings)
    mutable_parameters: Mapping[str, str] = attrs.field(factory=dict, converter=_strings)
    source: t.ContentSource | None = None
    created: float = 0.0
    attachments: Mapping[str, Attachment] = attrs.field(factory=dict, converter=_attachments)
    staging: Staging | None = None
    publications: Mapping[str, Publication] = attrs.field(
        factory=dict, converter=_publications
    )

    @property
    def in_use(self) -> bool:
        """Attached, staged or published somewhere."""
        return bool(self.attachments or self.staging or self.publications)

    def to_volume(self, context: Mapping[str, str] | None = None) -> t.Volume:
        """The volume as the CSI ``Volume`` message describes it."""
        return t.Volume(
            volume_id=self.volume_id,
            capacity_bytes=self.capacity_bytes,
            volume_context=context or {},
            content_source=self.source,
        )


@attrs.frozen(kw_only=True)
class SnapshotRecord:
    """A snapshot: a copy of ``source_volume_id`` taken at ``created``."""

    snapshot_id: str
    name: str
    source_volume_id: str
    size_bytes: int
    kind: AccessKind
    created: float
    parameters: Mapping[str, str] = attrs.field(factory=dict, converter=_strings)
    group_snapshot_id: str = ""

    def to_snapshot(self) -> t.Snapshot:
        """The snapshot as the CSI ``Snapshot`` message describes it (always ready)."""
        return t.Snapshot(
            snapshot_id=self.snapshot_id,
            source_volume_id=self.source_volume_id,
            size_bytes=self.size_bytes,
            creation_time=datetime.datetime.fromtimestamp(self.created, tz=datetime.UTC),
            ready_to_use=True,
            group_snapshot_id=self.group_snapshot_id,
        )


@attrs.frozen(kw_only=True)
class GroupSnapshotRecord:
    """A group snapshot: one member snapshot per source volume, cut together."""

    group_snapshot_id: str
    name: str
    source_volume_ids: tuple[str, ...]
    snapshot_ids: tuple[str, ...]
    created: float
    parameters: Mapping[str, str] = attrs.field(factory=dict, converter=_strings)


# --- JSON ---------------------------------------------------------------------------


def capability_to_json(cap: t.VolumeCapability) -> dict[str, object]:
    """A capability as a plain dict."""
    if isinstance(cap.access_type, t.BlockAccess):
        return {"mode": int(cap.access_mode), "block": True}
    return {
        "mode": int(cap.access_mode),
        "block": False,
        "fs_type": cap.access_type.fs_type,
        "mount_flags": list(cap.access_type.mount_flags),
        "volume_mount_group": cap.access_type.volume_mount_group,
    }


def capability_from_json(data: Mapping[str, Any]) -> t.VolumeCapability:
    """Read what :func:`capability_to_json` wrote."""
    if data.get("block"):
        return t.VolumeCapability.block(t.AccessMode(int(data["mode"])))
    return t.VolumeCapability(
        access_mode=t.AccessMode(int(data["mode"])),
        access_type=t.MountAccess(
            fs_type=str(data.get("fs_type", "")),
            mount_flags=tuple(data.get("mount_flags", ())),
            volume_mount_group=str(data.get("volume_mount_group", "")),
        ),
    )


def _source_to_json(source: t.ContentSource | None) -> dict[str, str] | None:
    if source is None:
        return None
    if isinstance(source, t.SnapshotSource):
        return {"snapshot_id": source.snapshot_id}
    return {"volume_id": source.volume_id}


def _source_from_json(data: Mapping[str, str] | None) -> t.ContentSource | None:
    if not data:
        return None
    if "snapshot_id" in data:
        return t.SnapshotSource(snapshot_id=data["snapshot_id"])
    return t.VolumeSource(volume_id=data["volume_id"])


def volume_to_json(rec: VolumeRecord) -> dict[str, object]:
    """A volume record as a plain dict."""
    return {
        "volume_id": rec.volume_id,
        "name": rec.name,
        "capacity_bytes": rec.capacity_bytes,
        "kind": rec.kind.value,
        "parameters": dict(rec.parameters),
        "mutable_parameters": dict(rec.mutable_parameters),
        "source": _source_to_json(rec.source),
        "created": rec.created,
        "attachments": [
            {
                "node_id": a.node_id,
                "readonly": a.readonly,
                "capability": capability_to_json(a.capability),
            }
            for a in rec.attachments.values()
        ],
        "staging": (
            None
            if rec.staging is None
            else {
                "path": rec.staging.path,
                "device": rec.staging.device,
                "capability": capability_to_json(rec.staging.capability),
            }
        ),
        "publications": [
            {
                "target_path": p.target_path,
                "staging_path": p.staging_path,
                "readonly": p.readonly,
                "capability": capability_to_json(p.capability),
            }
            for p in rec.publications.values()
        ],
    }


def volume_from_json(data: Mapping[str, Any]) -> VolumeRecord:
    """Read what :func:`volume_to_json` wrote."""
    staging = data.get("staging")
    return VolumeRecord(
        volume_id=data["volume_id"],
        name=data["name"],
        capacity_bytes=int(data["capacity_bytes"]),
        kind=AccessKind(data["kind"]),
        parameters=data.get("parameters", {}),
        mutable_parameters=data.get("mutable_parameters", {}),
        source=_source_from_json(data.get("source")),
        created=float(data.get("created", 0.0)),
        attachments={
            a["node_id"]: Attachment(
                node_id=a["node_id"],
                readonly=bool(a["readonly"]),
                capability=capability_from_json(a["capability"]),
            )
            for a in data.get("attachments", ())
        },
        staging=(
            None
            if not staging
            else Staging(
                path=staging["path"],
                device=staging.get("device", ""),
                capability=capability_from_json(staging["capability"]),
            )
        ),
        publications={
            p["target_path"]: Publication(
                target_path=p["target_path"],
                staging_path=p.get("staging_path", ""),
                readonly=bool(p["readonly"]),
                capability=capability_from_json(p["capability"]),
            )
            for p in data.get("publications", ())
        },
    )


def snapshot_to_json(rec: SnapshotRecord) -> dict[str, object]:
    """A snapshot record as a plain dict."""
    return {
        "snapshot_id": rec.snapshot_id,
        "name": rec.name,
        "source_volume_id": rec.source_volume_id,
        "size_bytes": rec.size_bytes,
        "kind": rec.kind.value,
        "created": rec.created,
        "parameters": dict(rec.parameters),
        "group_snapshot_id": rec.group_snapshot_id,
    }


def snapshot_from_json(data: Mapping[str, Any]) -> SnapshotRecord:
    """Read what :func:`snapshot_to_json` wrote."""
    return SnapshotRecord(
        snapshot_id=data["snapshot_id"],
        name=data["name"],
        source_volume_id=data["source_volume_id"],
        size_bytes=int(data["size_bytes"]),
        kind=AccessKind(data["kind"]),
        created=float(data["created"]),
        parameters=data.get("parameters", {}),
        group_snapshot_id=data.get("group_snapshot_id", ""),
    )


def group_to_json(rec: GroupSnapshotRecord) -> dict[str, object]:
    """A group snapshot record as a plain dict."""
    return {
        "group_snapshot_id": rec.group_snapshot_id,
        "name": rec.name,
        "source_volume_ids": list(rec.source_volume_ids),
        "snapshot_ids": list(rec.snapshot_ids),
        "created": rec.created,
        "parameters": dict(rec.parameters),
    }


def group_from_json(data: Mapping[str, Any]) -> GroupSnapshotRecord:
    """Read what :func:`group_to_json` wrote."""
    return GroupSnapshotRecord(
        group_snapshot_id=data["group_snapshot_id"],
        name=data["name"],
        source_volume_ids=tuple(data["source_volume_ids"]),
        snapshot_ids=tuple(data["snapshot_ids"]),
        created=float(data["created"]),
        parameters=data.get("parameters", {}),
    )
