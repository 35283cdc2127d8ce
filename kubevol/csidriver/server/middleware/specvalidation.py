"""Spec validation of requests (INVALID_ARGUMENT) and responses (INTERNAL).

Checks, per RPC, the fields the CSI spec marks REQUIRED (a required list or map needs an
entry), that every volume capability names an access mode and an access type, the optional
``X_CSI_REQUIRE_*`` fields, the values the spec forbids (control characters in names, secret
keys outside ``[A-Za-z0-9-_.]``, negative sizes and page lengths, a required size above its
limit), and the spec's size limits at every depth: strings 128 bytes,
node ids 256 bytes, paths ``max_path_limit`` bytes, each map (keys plus values) and the
mount flags 4 KiB in total.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs
import grpc

from kubevol.csi import pb
from kubevol.csi.errors import CSIRPCError
from kubevol.csi.redact import is_repeated
from kubevol.csidriver.server.config import ServerConfig
from kubevol.csidriver.server.middleware.base import CallInfo, Message, Middleware, Proceed

STRING_LIMIT = 128
NODE_ID_LIMIT = 256
MAP_LIMIT = 4096
PLUGIN_NAME_LIMIT = 63

_PATH_FIELDS = frozenset({"staging_target_path", "target_path", "volume_path"})
_NODE_ID_FIELDS = frozenset({"node_id", "published_node_ids"})
# Names may be any Unicode except these control characters (spec, CreateVolume.name).
_BANNED_NAME_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SECRET_KEY = re.compile(r"[A-Za-z0-9._-]+")
_PLUGIN_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?")

#: REQUIRED request fields per RPC (spec). ControllerModifyVolume's ``mutable_parameters``
#: is REQUIRED too, but an empty map cannot be told from an absent one on the wire, and
#: csi-sanity sends an empty map and expects NOT_FOUND or OK: it is left to the driver.
REQUIRED_REQUEST_FIELDS: Mapping[str, tuple[str, ...]] = {
    "CreateVolume": ("name", "volume_capabilities"),
    "DeleteVolume": ("volume_id",),
    "ControllerPublishVolume": ("volume_id", "node_id", "volume_capability"),
    "ControllerUnpublishVolume": ("volume_id",),
    "ValidateVolumeCapabilities": ("volume_id", "volume_capabilities"),
    "ControllerGetVolume": ("volume_id",),
    "ControllerModifyVolume": ("volume_id",),
    "CreateSnapshot": ("source_volume_id", "name"),
    "DeleteSnapshot": ("snapshot_id",),
    "GetSnapshot": ("snapshot_id",),
    "ControllerExpandVolume": ("volume_id", "capacity_range"),
    "CreateVolumeGroupSnapshot": ("name", "source_volume_ids"),
    "DeleteVolumeGroupSnapshot": ("group_snapshot_id",),
    "GetVolumeGroupSnapshot": ("group_snapshot_id",),
    "NodeStageVolume": ("volume_id", "staging_target_path", "volume_capability"),
    "NodeUnstageVolume": ("volume_id", "staging_target_path"),
    "NodePublishVolume": ("volume_id", "target_path", "volume_capability"),
    "NodeUnpublishVolume": ("volume_id", "target_path"),
    "NodeGetVolumeStats": ("volume_id", "volume_path"),
    "NodeExpandVolume": ("volume_id", "volume_path"),
}

_SNAPSHOT_FIELDS = ("snapshot_id", "source_volume_id", "creation_time")

#: REQUIRED response fields per RPC, as dotted paths ("volume.volume_id").
REQUIRED_RESPONSE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "GetPluginInfo": ("name", "vendor_version"),
    "CreateVolume": ("volume", "volume.volume_id"),
    "ControllerGetVolume": ("volume", "volume.volume_id"),
    "CreateSnapshot": ("snapshot", *(f"snapshot.{f}" for f in _SNAPSHOT_FIELDS)),
    "GetSnapshot": ("snapshot", *(f"snapshot.{f}" for f in _SNAPSHOT_FIELDS)),
    "CreateVolumeGroupSnapshot": ("group_snapshot", "group_snapshot.group_snapshot_id"),
    "GetVolumeGroupSnapshot": ("group_snapshot", "group_snapshot.group_snapshot_id"),
    "NodeGetInfo": ("node_id",),
}


@attrs.frozen(kw_only=True)
class SpecRules:
    """What to check beyond the spec's REQUIRED fields (from :class:`ServerConfig`)."""

    check_lengths: bool = True
    max_path_limit: int = 4096
    require_staging_target_path: bool = False
    require_vol_context: bool = False
    require_pub_context: bool = False
    require_creds: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, config: ServerConfig) -> SpecRules:
        """The rules ``config``'s ``X_CSI_*`` toggles ask for."""
        return cls(
            check_lengths=not config.disable_len_check,
            max_path_limit=config.max_path_limit,
            require_staging_target_path=config.require_staging_target_path,
            require_vol_context=config.require_vol_context,
            require_pub_context=config.require_pub_context,
            require_creds=config.require_creds,
        )

    def required_request_fields(self, rpc_name: str) -> tuple[str, ...]:
        """The spec's required fields of ``rpc_name`` plus those the toggles add."""
        fields = list(REQUIRED_REQUEST_FIELDS.get(rpc_name, ()))
        if self.require_staging_target_path and rpc_name == "NodePublishVolume":
            fields.append("staging_target_path")
        if self.require_vol_context and rpc_name in {
            "ControllerPublishVolume",
            "ValidateVolumeCapabilities",
            "NodeStageVolume",
            "NodePublishVolume",
        }:
            fields.append("volume_context")
        if self.require_pub_context and rpc_name in {"NodeStageVolume", "NodePublishVolume"}:
            fields.append("publish_context")
        if rpc_name in self.require_creds:
            fields.append("secrets")
        return tuple(fields)

    def required_response_fields(self, rpc_name: str) -> tuple[str, ...]:
        """The spec's required response fields plus those the toggles add."""
        fields = list(REQUIRED_RESPONSE_FIELDS.get(rpc_name, ()))
        if self.require_vol_context and rpc_name == "CreateVolume":
            fields.append("volume.volume_context")
        if self.require_pub_context and rpc_name == "ControllerPublishVolume":
            fields.append("publish_context")
        return tuple(fields)


def _present(message: Message, path: str) -> bool:
    *parents, last = path.split(".")
    for name in parents:
        if not message.HasField(name):
            return False
        message = getattr(message, name)
    field = message.DESCRIPTOR.fields_by_name[last]
    value = getattr(message, last)
    if is_repeated(field):
        return len(value) > 0
    if field.message_type is not None:
        return bool(message.HasField(last))
    return bool(value)


def find_request_problem(rpc_name: str, request: Message, rules: SpecRules) -> str | None:
    """Why ``request`` breaks the spec (or the rules), or None when it is valid."""
    for path in rules.required_request_fields(rpc_name):
        if not _present(request, path):
            return f"{path} is required"
    for name in ("volume_capability", "volume_capabilities"):
        if name not in request.DESCRIPTOR.fields_by_name:
            continue
        value = getattr(request, name)
        caps = (
            value if name == "volume_capabilities" else ([value] if request.HasField(name) else [])
        )
        for cap in caps:
            if not cap.HasField("access_mode") or cap.access_mode.mode == 0:
                return f"{name}: access_mode is required"
            if cap.WhichOneof("access_type") is None:
                return f"{name}: access_type (block or mount) is required"
    problem = _find_value_problem(request)
    if problem:
        return problem
    if rules.check_lengths:
        return find_size_problem(request, rules.max_path_limit)
    return None


def _field(message: Message, name: str) -> object:
    """Field ``name`` of ``message`` (read by name: the checks serve every RPC), or None
    when the message has no such field."""
    if name not in message.DESCRIPTOR.fields_by_name:
        return None
    value: object = getattr(message, name)
    return value


def _find_value_problem(request: Message) -> str | None:
    """Values the spec forbids: control characters in names, odd secret keys, negatives."""
    name = _field(request, "name")
    if isinstance(name, str) and _BANNED_NAME_CHARS.search(name):
        return "name contains a control character the spec bans"
    secrets = _field(request, "secrets")
    if isinstance(secrets, Mapping):
        for key in secrets:
            if not _SECRET_KEY.fullmatch(key):
                return f"secrets key {key!r} is not made of [A-Za-z0-9-_.]"
    max_entries = _field(request, "max_entries")
    if isinstance(max_entries, int) and max_entries < 0:
        return "max_entries must not be negative"
    rng = _field(request, "capacity_range")
    if isinstance(rng, pb.CapacityRange) and request.HasField("capacity_range"):
        if rng.required_bytes < 0 or rng.limit_bytes < 0:
            return "capacity_range must not be negative"
        if rng.limit_bytes and rng.required_bytes > rng.limit_bytes:
            return "capacity_range.required_bytes exceeds limit_bytes"
    return None


def find_response_problem(rpc_name: str, response: Message, rules: SpecRules) -> str | None:
    """Why ``response`` breaks the spec (or the rules), or None when it is valid."""
    for path in rules.required_response_fields(rpc_name):
        if not _present(response, path):
            return f"response field {path} is required"
    if rpc_name == "GetPluginInfo" and isinstance(response, pb.GetPluginInfoResponse):
        name = response.name
        if len(name) > PLUGIN_NAME_LIMIT or not _PLUGIN_NAME.fullmatch(name):
            return (
                f"plugin name {name!r} must be at most {PLUGIN_NAME_LIMIT} characters of "
                "alphanumerics, '-' and '.', starting and ending with an alphanumeric"
            )
    if rpc_name == "ListVolumes" and isinstance(response, pb.ListVolumesResponse):
        for entry in response.entries:
            if not entry.volume.volume_id:
                return "response field entries.volume.volume_id is required"
    if rpc_name == "ListSnapshots" and isinstance(response, pb.ListSnapshotsResponse):
        for snapshot_entry in response.entries:
            for field_name in _SNAPSHOT_FIELDS:
                if not _present(snapshot_entry.snapshot, field_name):
                    return f"response field entries.snapshot.{field_name} is required"
    if rules.check_lengths:
        return find_size_problem(response, rules.max_path_limit)
    return None


def find_size_problem(message: Message, path_limit: int, prefix: str = "") -> str | None:
    """The first field of ``message`` (at any depth) over the spec's size limits, or None."""
    for field, value in message.ListFields():
        name = f"{prefix}{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is None:
                total = sum(len(k.encode()) + len(str(v).encode()) for k, v in value.items())
                if total > MAP_LIMIT:
                    return f"{name} is {total} bytes, over the {MAP_LIMIT}-byte map limit"
            else:
                for key, item in value.items():
                    problem = find_size_problem(item, path_limit, f"{name}[{key}].")
                    if problem:
                        return problem
        elif field.message_type is not None:
            items = value if is_repeated(field) else [value]
            for index, item in enumerate(items):
                sub = f"{name}[{index}]." if is_repeated(field) else f"{name}."
                problem = find_size_problem(item, path_limit, sub)
                if problem:
                    return problem
        elif field.type == field.TYPE_STRING:
            items = list(value) if is_repeated(field) else [value]
            if field.name == "mount_flags":
                total = sum(len(s.encode()) for s in items)
                if total > MAP_LIMIT:
                    return f"{name} is {total} bytes, over the {MAP_LIMIT}-byte limit"
                continue
            limit = _string_limit(field.name, path_limit)
            for item in items:
                size = len(item.encode())
                if size > limit:
                    return f"{name} is {size} bytes, over the {limit}-byte limit"
    return None


def _string_limit(field_name: str, path_limit: int) -> int:
    if field_name in _PATH_FIELDS:
        return path_limit
    if field_name in _NODE_ID_FIELDS:
        return NODE_ID_LIMIT
    return STRING_LIMIT


class SpecValidationMiddleware(Middleware):
    """Reject bad requests with INVALID_ARGUMENT and bad responses with INTERNAL."""

    def __init__(self, rules: SpecRules, *, requests: bool, responses: bool) -> None:
        self.rules = rules
        self.requests = requests
        self.responses = responses

    def handle(
        self, call: CallInfo, request: Message, context: grpc.ServicerContext, proceed: Proceed
    ) -> Message:
        name = call.rpc.name
        if self.requests:
            problem = find_request_problem(name, request, self.rules)
            if problem:
                raise CSIRPCError(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {problem}")
        response = proceed(request)
        if self.responses:
            problem = find_response_problem(name, response, self.rules)
            if problem:
                raise CSIRPCError(
                    grpc.StatusCode.INTERNAL, f"{name}: driver sent an invalid response: {problem}"
                )
        return response
