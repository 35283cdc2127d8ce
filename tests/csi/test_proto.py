"""Covers kubevol.csi._pb and the descriptors generated in kubevol.csi._generated.

kubevol's generated CSI descriptors against figures written down from CSI spec v1.12.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from kubevol.csi._pb import csi_pb2, registration_pb2

REPO = Path(__file__).resolve().parents[2]

# (message, field) -> (number, type name, repeated) as in the spec's csi.proto.
SPEC_FIELDS: dict[tuple[str, str], tuple[int, str, bool]] = {
    ("GetPluginInfoResponse", "name"): (1, "string", False),
    ("GetPluginInfoResponse", "manifest"): (3, "message", True),
    ("CreateVolumeRequest", "name"): (1, "string", False),
    ("CreateVolumeRequest", "capacity_range"): (2, "message", False),
    ("CreateVolumeRequest", "volume_capabilities"): (3, "message", True),
    ("CreateVolumeRequest", "secrets"): (5, "message", True),
    ("CreateVolumeRequest", "accessibility_requirements"): (7, "message", False),
    ("CreateVolumeRequest", "mutable_parameters"): (8, "message", True),
    ("VolumeCapability", "block"): (1, "message", False),
    ("VolumeCapability", "mount"): (2, "message", False),
    ("VolumeCapability", "access_mode"): (3, "message", False),
    ("VolumeCapability.MountVolume", "volume_mount_group"): (3, "string", False),
    ("CapacityRange", "limit_bytes"): (2, "int64", False),
    ("Volume", "capacity_bytes"): (1, "int64", False),
    ("Volume", "volume_id"): (2, "string", False),
    ("Volume", "accessible_topology"): (5, "message", True),
    ("ControllerPublishVolumeRequest", "readonly"): (4, "bool", False),
    ("ControllerPublishVolumeRequest", "volume_context"): (6, "message", True),
    ("ControllerUnpublishVolumeRequest", "secrets"): (3, "message", True),
    ("ValidateVolumeCapabilitiesRequest", "mutable_parameters"): (6, "message", True),
    ("ListVolumesRequest", "max_entries"): (1, "int32", False),
    ("ListVolumesResponse.VolumeStatus", "volume_condition"): (2, "message", False),
    ("GetCapacityResponse", "minimum_volume_size"): (3, "message", False),
    ("CreateSnapshotRequest", "source_volume_id"): (1, "string", False),
    ("CreateSnapshotRequest", "name"): (2, "string", False),
    ("Snapshot", "creation_time"): (4, "message", False),
    ("Snapshot", "ready_to_use"): (5, "bool", False),
    ("Snapshot", "group_snapshot_id"): (6, "string", False),
    ("ListSnapshotsRequest", "secrets"): (5, "message", True),
    ("ControllerExpandVolumeResponse", "node_expansion_required"): (2, "bool", False),
    ("ControllerModifyVolumeRequest", "mutable_parameters"): (3, "message", True),
    ("NodeStageVolumeRequest", "staging_target_path"): (3, "string", False),
    ("NodeStageVolumeRequest", "volume_context"): (6, "message", True),
    ("NodePublishVolumeRequest", "target_path"): (4, "string", False),
    ("NodePublishVolumeRequest", "readonly"): (6, "bool", False),
    ("NodePublishVolumeRequest", "secrets"): (7, "message", True),
    ("NodePublishVolumeRequest", "volume_context"): (8, "message", True),
    ("NodeGetVolumeStatsRequest", "staging_target_path"): (3, "string", False),
    ("VolumeUsage", "unit"): (4, "enum", False),
    ("NodeGetInfoResponse", "max_volumes_per_node"): (2, "int64", False),
    ("NodeExpandVolumeRequest", "secrets"): (6, "message", True),
    ("VolumeGroupSnapshot", "ready_to_use"): (4, "bool", False),
    ("DeleteVolumeGroupSnapshotRequest", "snapshot_ids"): (2, "string", True),
    ("GetMetadataDeltaRequest", "starting_offset"): (3, "int64", False),
    ("GetMetadataDeltaRequest", "max_results"): (4, "int32", False),
    ("GetMetadataAllocatedResponse", "block_metadata"): (3, "message", True),
}

SPEC_ENUMS: dict[str, dict[str, int]] = {
    "PluginCapability.Service.Type": {
        "GROUP_CONTROLLER_SERVICE": 3,
        "SNAPSHOT_METADATA_SERVICE": 4,
    },
    "VolumeCapability.AccessMode.Mode": {
        "MULTI_NODE_MULTI_WRITER": 5,
        "SINGLE_NODE_MULTI_WRITER": 7,
    },
    "ControllerServiceCapability.RPC.Type": {
        "EXPAND_VOLUME": 9,
        "MODIFY_VOLUME": 14,
        "GET_SNAPSHOT": 15,
    },
    "NodeServiceCapability.RPC.Type": {"VOLUME_MOUNT_GROUP": 6, "GET_VOLUME_STATS": 2},
    "BlockMetadataType": {"VARIABLE_LENGTH": 2},
}

# Requests whose secrets map the spec marks csi_secret.
SECRET_REQUESTS = {
    f"{rpc}Request"
    for rpc in (
        "CreateVolume",
        "DeleteVolume",
        "ControllerPublishVolume",
        "ControllerUnpublishVolume",
        "ValidateVolumeCapabilities",
        "ControllerModifyVolume",
        "CreateSnapshot",
        "DeleteSnapshot",
        "ListSnapshots",
        "GetSnapshot",
        "ControllerExpandVolume",
        "NodeStageVolume",
        "NodePublishVolume",
        "NodeExpandVolume",
        "CreateVolumeGroupSnapshot",
        "DeleteVolumeGroupSnapshot",
        "GetVolumeGroupSnapshot",
        "GetMetadataAllocated",
        "GetMetadataDelta",
    )
}

_TYPE_NAMES = {
    9: "string",
    3: "int64",
    5: "int32",
    8: "bool",
    11: "message",
    14: "enum",
}


def _message(name: str) -> Any:
    return csi_pb2.DESCRIPTOR.pool.FindMessageTypeByName(f"csi.v1.{name}")


def _all_messages(descriptor: Any) -> list[Any]:
    found = []
    for msg in descriptor.message_types_by_name.values():
        stack = [msg]
        while stack:
            item = stack.pop()
            found.append(item)
            stack.extend(item.nested_types)
    return found


@pytest.mark.parametrize(("key", "expected"), sorted(SPEC_FIELDS.items()))
def test_field_number_and_type_match_the_spec(
    key: tuple[str, str], expected: tuple[int, str, bool]
) -> None:
    """Each sampled field has the spec's number, type and cardinality."""
    message, field_name = key
    field = _message(message).fields_by_name[field_name]
    assert (field.number, _TYPE_NAMES[field.type], field.label == field.LABEL_REPEATED) == expected


def test_enum_values_match_the_spec() -> None:
    """Sampled enum values have the spec's numbers."""
    for enum_name, values in SPEC_ENUMS.items():
        enum = csi_pb2.DESCRIPTOR.pool.FindEnumTypeByName(f"csi.v1.{enum_name}")
        for name, number in values.items():
            assert enum.values_by_name[name].number == number, (enum_name, name)


def test_services_and_methods_match_the_spec() -> None:
    """Every CSI service exists with the spec's methods, SnapshotMetadata streaming."""
    services = csi_pb2.DESCRIPTOR.services_by_name
    assert set(services) == {
        "Identity",
        "Controller",
        "GroupController",
        "Node",
        "SnapshotMetadata",
    }
    assert len(services["Controller"].methods) == 15
    assert len(services["Node"].methods) == 8
    assert len(services["GroupController"].methods) == 4
    assert all(m.server_streaming for m in services["SnapshotMetadata"].methods)


def test_option_extension_numbers() -> None:
    """csi_secret is FieldOptions 1059 and every alpha option is 1060."""
    assert csi_pb2.csi_secret.number == 1059
    assert csi_pb2.csi_secret.containing_type.full_name == "google.protobuf.FieldOptions"
    for name in (
        "alpha_field",
        "alpha_enum",
        "alpha_enum_value",
        "alpha_message",
        "alpha_method",
        "alpha_service",
    ):
        assert getattr(csi_pb2, name).number == 1060, name


def test_every_secrets_field_carries_csi_secret() -> None:
    """Every field named secrets has (csi_secret) = true, and no other field has it."""
    secret_fields = []
    for msg in _all_messages(csi_pb2.DESCRIPTOR):
        for field in msg.fields:
            marked = field.GetOptions().Extensions[csi_pb2.csi_secret]
            assert marked == (field.name == "secrets"), field.full_name
            if marked:
                secret_fields.append(field.full_name)
    assert {name.split(".")[2] for name in secret_fields} == SECRET_REQUESTS


def test_alpha_methods_are_marked() -> None:
    """GetSnapshot and ControllerGetVolume carry alpha_method; SnapshotMetadata alpha_service."""
    controller = csi_pb2.DESCRIPTOR.services_by_name["Controller"]
    alpha = {m.name for m in controller.methods if m.GetOptions().Extensions[csi_pb2.alpha_method]}
    assert alpha == {"GetSnapshot", "ControllerGetVolume"}
    metadata = csi_pb2.DESCRIPTOR.services_by_name["SnapshotMetadata"]
    assert metadata.GetOptions().Extensions[csi_pb2.alpha_service]


def test_plugin_registration_api() -> None:
    """pluginregistration.Registration has GetInfo and NotifyRegistrationStatus, v1 fields."""
    service = registration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    info = registration_pb2.PluginInfo.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in info.items()} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    status = registration_pb2.RegistrationStatus.DESCRIPTOR.fields_by_name
    assert (status["plugin_registered"].number, status["error"].number) == (1, 2)


@pytest.mark.root
def test_generated_code_is_up_to_date() -> None:
    """The committed generated modules are exactly what the generation script produces."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "generate-protos.sh"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_wire_bytes_of_a_request_match_hand_encoding() -> None:
    """NodePublishVolumeRequest encodes with the spec's tags (1: id, 4: target, 6: readonly)."""
    msg = csi_pb2.NodePublishVolumeRequest(volume_id="v", target_path="/t", readonly=True)
    assert msg.SerializeToString() == b"\x0a\x01v" + b"\x22\x02/t" + b"\x30\x01"
    secret = csi_pb2.NodeStageVolumeRequest(secrets={"k": "s"})
    # field 5, length-delimited map entry {1: "k", 2: "s"}
    assert secret.SerializeToString() == b"\x2a\x06\x0a\x01k\x12\x01s"
