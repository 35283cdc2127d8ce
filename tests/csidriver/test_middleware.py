"""Covers kubevol.csidriver.server.middleware.

Every middleware behaviour, through real gRPC on a unix socket with the test driver.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.errors import CSIRPCError, CSIRPCUncertainError
from kubevol.csi.redact import STRIPPED, Redactor
from kubevol.csidriver.server import ServerConfigError
from tests.csi.support import Served, ServeFactory

CAP = t.VolumeCapability.mount()
CANARY = "CANARY-s3cr3t-8d1f"
SECRETS = {"password": CANARY, "token": CANARY + "-2"}


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(CSIRPCError) as err:
        call()
    return err.value.code


# --- request id -----------------------------------------------------------------------


def test_request_id_comes_from_metadata_else_a_counter(serve_driver: ServeFactory) -> None:
    """With logging on, csi.requestid metadata is the id; without it ids count up."""
    served = serve_driver({"X_CSI_REQ_LOGGING": "true"})
    c, b = served.client, served.driver
    c.node_get_info(metadata={"csi.requestid": "co-7"})
    c.node_get_info()
    c.node_get_info()
    assert b.seen_request_ids == ["co-7", "0001", "0002"]


def test_request_id_is_off_without_logging(served: Served) -> None:
    """As in gocsi, no request id is assigned when logging is off."""
    served.client.node_get_info(metadata={"csi.requestid": "co-7"})
    assert served.driver.seen_request_ids == [""]


# --- logging and redaction --------------------------------------------------------------


def test_canary_secret_never_reaches_any_log(
    serve_driver: ServeFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """At debug level, with request and response logging, no secret value is ever logged."""
    caplog.set_level(logging.DEBUG)
    served = serve_driver({"X_CSI_DEBUG": "true"})
    c, b = served.client, served.driver
    target = str(tmp_path / "t")
    c.create_volume("pvc-1", [CAP], secrets=SECRETS)
    c.delete_volume("v1", secrets=SECRETS)
    c.controller_publish_volume("v1", "n1", CAP, secrets=SECRETS)
    c.controller_unpublish_volume("v1", "n1", secrets=SECRETS)
    c.validate_volume_capabilities("v1", [CAP], secrets=SECRETS)
    c.controller_expand_volume("v1", t.CapacityRange(required_bytes=1), secrets=SECRETS)
    c.controller_modify_volume("v1", {"iops": "1"}, secrets=SECRETS)
    c.create_snapshot("v1", "s1", secrets=SECRETS)
    c.create_volume_group_snapshot("g1", ["v1"], secrets=SECRETS)
    c.node_stage_volume("v1", str(tmp_path), CAP, secrets=SECRETS)
    c.node_publish_volume("v1", target, CAP, secrets=SECRETS)
    c.node_expand_volume("v1", target, secrets=SECRETS)
    b.fail["NodeStageVolume"] = (grpc.StatusCode.INTERNAL, "failed")
    with pytest.raises(CSIRPCError):
        c.node_stage_volume("v2", str(tmp_path), CAP, secrets=SECRETS)
    with pytest.raises(CSIRPCError):  # unimplemented in the driver, still logged
        c.list_snapshots(secrets=SECRETS)
    out, err = capfd.readouterr()
    logged = caplog.text + out + err
    assert CANARY not in logged
    assert "NodePublishVolume: REQ" in caplog.text
    assert "NodeStageVolume: REP" in caplog.text and "INTERNAL" in caplog.text
    assert caplog.text.count(STRIPPED) >= 2 * 14


def test_volume_context_can_be_left_out_of_logs(
    serve_driver: ServeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """X_CSI_LOG_DISABLE_VOL_CTX drops volume contexts from logged requests."""
    caplog.set_level(logging.DEBUG)
    served = serve_driver({"X_CSI_REQ_LOGGING": "1", "X_CSI_LOG_DISABLE_VOL_CTX": "1"})
    served.client.node_publish_volume(
        "v1", str(tmp_path / "t"), CAP, volume_context={"share": "hidden-ctx-value"}
    )
    assert "NodePublishVolume: REQ" in caplog.text
    assert "hidden-ctx-value" not in caplog.text


def _nested_secret_type() -> Any:
    """A message type with csi_secret fields nested in a message, a list and a map."""
    d = descriptor_pb2
    # The protobuf runtime's descriptor API is untyped in its stubs.
    pool: Any = descriptor_pool.DescriptorPool()
    default_pool: Any = descriptor_pool.Default()  # type: ignore[no-untyped-call]
    descriptor: Any = d.DESCRIPTOR
    fd_desc = d.FileDescriptorProto()
    descriptor.CopyToProto(fd_desc)
    pool.Add(fd_desc)
    csi_file = d.FileDescriptorProto()
    csi_pb2.DESCRIPTOR.CopyToProto(csi_file)
    for dep in ("google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"):
        dep_file = d.FileDescriptorProto()
        default_pool.FindFileByName(dep).CopyToProto(dep_file)
        pool.Add(dep_file)
    pool.Add(csi_file)
    test_file = d.FileDescriptorProto(
        name="kubevol_redact_test.proto",
        package="kubevol.test",
        syntax="proto3",
        dependency=["csi.proto"],
    )
    inner = test_file.message_type.add(name="Inner")
    secret = inner.field.add(name="password", number=1, type=d.FieldDescriptorProto.TYPE_STRING)
    secret.options.Extensions[csi_pb2.csi_secret] = True
    inner.field.add(name="user", number=2, type=d.FieldDescriptorProto.TYPE_STRING)
    outer = test_file.message_type.add(name="Outer")
    outer.field.add(
        name="inner",
        number=1,
        type=d.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=".kubevol.test.Inner",
    )
    outer.field.add(
        name="items",
        number=2,
        type=d.FieldDescriptorProto.TYPE_MESSAGE,
        label=d.FieldDescriptorProto.LABEL_REPEATED,
        type_name=".kubevol.test.Inner",
    )
    entry = outer.nested_type.add(name="ByKeyEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=d.FieldDescriptorProto.TYPE_STRING)
    entry.field.add(
        name="value",
        number=2,
        type=d.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=".kubevol.test.Inner",
    )
    outer.field.add(
        name="by_key",
        number=3,
        type=d.FieldDescriptorProto.TYPE_MESSAGE,
        label=d.FieldDescriptorProto.LABEL_REPEATED,
        type_name=".kubevol.test.Outer.ByKeyEntry",
    )
    pool.Add(test_file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("kubevol.test.Outer"))


def test_redaction_follows_the_option_at_every_depth() -> None:
    """Secrets nested in a sub-message, a repeated message and a map value are stripped."""
    outer_type = _nested_secret_type()
    msg = outer_type()
    msg.inner.password = CANARY
    msg.inner.user = "alice"
    msg.items.add(password=CANARY, user="bob")
    msg.by_key["k"].password = CANARY
    text = Redactor().to_text(msg)
    assert CANARY not in text
    assert "alice" in text and "bob" in text and STRIPPED in text
    assert msg.inner.password == CANARY  # the original is untouched


def test_redaction_keeps_messages_without_secrets_as_is() -> None:
    """A message type holding no secret is returned itself, not copied."""
    msg = csi_pb2.NodeGetInfoResponse(node_id="n")
    assert Redactor().redact(msg) is msg


# --- spec validation ------------------------------------------------------------------


VALIDATING = {"X_CSI_SPEC_VALIDATION": "true"}


def _pub(**fields: Any) -> Any:
    base: dict[str, Any] = {
        "volume_id": "v1",
        "target_path": "/tmp/kubevol-test-target",
        "volume_capability": csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(),
            access_mode=csi_pb2.VolumeCapability.AccessMode(mode=1),
        ),
    }
    base.update(fields)
    return csi_pb2.NodePublishVolumeRequest(**{k: v for k, v in base.items() if v is not None})


@pytest.mark.parametrize(
    ("rpc", "request_msg"),
    [
        ("NodePublishVolume", _pub(volume_id="")),
        ("NodePublishVolume", _pub(target_path="")),
        ("NodePublishVolume", _pub(volume_capability=None)),
        (
            "NodePublishVolume",
            _pub(
                volume_capability=csi_pb2.VolumeCapability(
                    mount=csi_pb2.VolumeCapability.MountVolume()
                )
            ),
        ),
        (
            "NodePublishVolume",
            _pub(
                volume_capability=csi_pb2.VolumeCapability(
                    access_mode=csi_pb2.VolumeCapability.AccessMode(mode=1)
                )
            ),
        ),
        ("NodePublishVolume", _pub(volume_id="x" * 129)),
        ("NodePublishVolume", _pub(volume_context={"k": "v" * 4096})),
        ("NodeStageVolume", csi_pb2.NodeStageVolumeRequest(volume_id="v1")),
        ("NodeUnstageVolume", csi_pb2.NodeUnstageVolumeRequest(staging_target_path="/s")),
        ("DeleteVolume", csi_pb2.DeleteVolumeRequest()),
        ("CreateVolume", csi_pb2.CreateVolumeRequest(name="n")),
        (
            "ControllerPublishVolume",
            csi_pb2.ControllerPublishVolumeRequest(volume_id="v", node_id="n"),
        ),
        (
            "ControllerPublishVolume",
            csi_pb2.ControllerPublishVolumeRequest(
                volume_id="v", node_id="n" * 257, volume_capability=_pub().volume_capability
            ),
        ),
        ("ControllerExpandVolume", csi_pb2.ControllerExpandVolumeRequest(volume_id="v")),
        (
            "ControllerModifyVolume",
            csi_pb2.ControllerModifyVolumeRequest(mutable_parameters={"k": "v"}),
        ),
        ("CreateSnapshot", csi_pb2.CreateSnapshotRequest(name="s")),
        ("NodeGetVolumeStats", csi_pb2.NodeGetVolumeStatsRequest(volume_id="v")),
        (
            "CreateVolume",
            csi_pb2.CreateVolumeRequest(
                name="bad\x07name", volume_capabilities=[_pub().volume_capability]
            ),
        ),
        ("NodePublishVolume", _pub(secrets={"bad key": "v"})),
        ("ListVolumes", csi_pb2.ListVolumesRequest(max_entries=-1)),
        (
            "ControllerExpandVolume",
            csi_pb2.ControllerExpandVolumeRequest(
                volume_id="v",
                capacity_range=csi_pb2.CapacityRange(required_bytes=10, limit_bytes=5),
            ),
        ),
        (
            "ControllerExpandVolume",
            csi_pb2.ControllerExpandVolumeRequest(
                volume_id="v", capacity_range=csi_pb2.CapacityRange(required_bytes=-1)
            ),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_malformed_request_is_invalid_argument(
    serve_driver: ServeFactory, rpc: str, request_msg: Any
) -> None:
    """Missing required fields, capabilities without mode or type, and oversize values."""
    served = serve_driver(VALIDATING)
    with pytest.raises(CSIRPCError) as err:
        served.client.call(rpc, request_msg)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert rpc not in served.driver.calls


def test_values_at_the_limits_are_accepted(serve_driver: ServeFactory, tmp_path: Path) -> None:
    """128-byte ids, 256-byte node ids, 4 KiB maps and long paths pass validation."""
    served = serve_driver(VALIDATING)
    c = served.client
    deep = tmp_path / ("d" * 200)
    c.node_publish_volume("v" * 128, str(deep), CAP, volume_context={"k": "v" * 4095})
    c.controller_publish_volume("v1", "n" * 256, CAP, secrets={"user.name_2-x": "v"})
    c.create_volume("pvc \u00e9t\u00e9\ttab", [CAP])  # Unicode and common whitespace are fine
    assert served.driver.calls == [
        "NodePublishVolume",
        "ControllerPublishVolume",
        "CreateVolume",
    ]


def test_length_check_can_be_disabled(serve_driver: ServeFactory, tmp_path: Path) -> None:
    """X_CSI_SPEC_DISABLE_LEN_CHECK lets oversize strings through."""
    served = serve_driver({**VALIDATING, "X_CSI_SPEC_DISABLE_LEN_CHECK": "true"})
    served.client.node_publish_volume("v" * 300, str(tmp_path / "t"), CAP)


@pytest.mark.parametrize(
    ("variable", "satisfied"),
    [
        ("X_CSI_REQUIRE_PUB_CONTEXT", {"publish_context": {"device": "/dev/x"}}),
        ("X_CSI_REQUIRE_VOL_CONTEXT", {"volume_context": {"share": "s"}}),
        ("X_CSI_REQUIRE_CREDS_NODE_PUB_VOL", {"secrets": {"user": "u"}}),
        ("X_CSI_REQUIRE_CREDS", {"secrets": {"user": "u"}}),
        ("X_CSI_REQUIRE_STAGING_TARGET_PATH", {"staging_target_path": "/staging"}),
    ],
)
def test_require_toggles_add_required_fields(
    serve_driver: ServeFactory, tmp_path: Path, variable: str, satisfied: dict[str, Any]
) -> None:
    """Each X_CSI_REQUIRE_* toggle rejects NodePublish without its field and accepts it with."""
    served = serve_driver({"X_CSI_SPEC_REQ_VALIDATION": "true", variable: "true"})
    target = str(tmp_path / "t")
    code = _code(lambda: served.client.node_publish_volume("v1", target, CAP))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    served.client.node_publish_volume("v1", target, CAP, **satisfied)


def _raw_call(served: Served, rpc: str, request: Any) -> grpc.RpcError:
    """Call with a bare grpc channel to inspect the status as sent."""
    from kubevol.csi._rpc import RPCS

    info = RPCS[rpc]
    with grpc.insecure_channel(served.handle.endpoint.grpc_target) as channel:
        method = channel.unary_unary(
            info.path,
            request_serializer=info.request_type.SerializeToString,
            response_deserializer=info.response_type.FromString,
        )
        with pytest.raises(grpc.RpcError) as err:
            method(request, timeout=10)
    return err.value


@pytest.mark.parametrize(
    ("change", "rpc", "request_msg"),
    [
        ({"node_id": ""}, "NodeGetInfo", csi_pb2.NodeGetInfoRequest()),
        ({"node_id": "n" * 257}, "NodeGetInfo", csi_pb2.NodeGetInfoRequest()),
        ({"plugin_name": "bad_name!"}, "GetPluginInfo", csi_pb2.GetPluginInfoRequest()),
        ({"plugin_name": "a" * 64}, "GetPluginInfo", csi_pb2.GetPluginInfoRequest()),
    ],
)
def test_bad_response_is_internal_with_empty_details(
    serve_driver: ServeFactory, change: dict[str, str], rpc: str, request_msg: Any
) -> None:
    """A response breaking the spec becomes INTERNAL, with no status details attached."""
    served = serve_driver({"X_CSI_SPEC_REP_VALIDATION": "true"})
    for key, value in change.items():
        setattr(served.driver, key, value)
    err = _raw_call(served, rpc, request_msg)
    assert err.code() is grpc.StatusCode.INTERNAL
    trailers = dict(err.trailing_metadata() or ())
    assert "grpc-status-details-bin" not in trailers
    assert "invalid response" in (err.details() or "")


def test_request_validation_alone_lets_bad_responses_through(serve_driver: ServeFactory) -> None:
    """With only X_CSI_SPEC_REQ_VALIDATION, responses are not checked."""
    served = serve_driver({"X_CSI_SPEC_REQ_VALIDATION": "true"})
    served.driver.node_id = ""
    assert served.client.node_get_info().node_id == ""


# --- plugin info override --------------------------------------------------------------


def test_plugin_info_override_answers_without_the_driver(serve_driver: ServeFactory) -> None:
    """X_CSI_PLUGIN_INFO answers GetPluginInfo; the driver's method is not called."""
    served = serve_driver({"X_CSI_PLUGIN_INFO": "override.example.com, 9.9.9, a=b, c=d"})
    info = served.client.get_plugin_info()
    assert info == t.PluginInfo(
        name="override.example.com", vendor_version="9.9.9", manifest={"a": "b", "c": "d"}
    )
    assert "GetPluginInfo" not in served.driver.calls


@pytest.mark.parametrize("value", ["only-a-name", ", 1.0", "n, 1.0, novalue"])
def test_malformed_plugin_info_fails_at_start(serve_driver: ServeFactory, value: str) -> None:
    """A malformed X_CSI_PLUGIN_INFO is refused before serving, naming the variable."""
    with pytest.raises(ServerConfigError, match="X_CSI_PLUGIN_INFO"):
        serve_driver({"X_CSI_PLUGIN_INFO": value})


# --- serial volume access (in process) -------------------------------------------------


SERIAL = {"X_CSI_SERIAL_VOL_ACCESS": "true"}


def _hold(
    served: Served, rpc: str, call: Callable[[], object]
) -> tuple[threading.Event, threading.Thread, list[object]]:
    """Start ``call`` in a thread and wait until the driver is blocked inside ``rpc``."""
    gate, entered = threading.Event(), threading.Event()
    served.driver.block[rpc] = gate
    served.driver.entered[rpc] = entered
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # reported to the test through outcome
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert entered.wait(10), f"{rpc} never reached the driver"
    return gate, thread, outcome


def test_concurrent_operations_on_one_volume_one_is_aborted(
    serve_driver: ServeFactory, tmp_path: Path
) -> None:
    """While NodePublish holds volume v1, other calls on v1 are ABORTED; v2 is not blocked."""
    served = serve_driver(SERIAL)
    c = served.client
    gate, thread, outcome = _hold(
        served, "NodePublishVolume", lambda: c.node_publish_volume("v1", str(tmp_path / "a"), CAP)
    )
    with pytest.raises(CSIRPCUncertainError) as err:
        c.node_publish_volume("v1", str(tmp_path / "b"), CAP)
    assert err.value.code is grpc.StatusCode.ABORTED
    assert (
        _code(lambda: c.node_unpublish_volume("v1", str(tmp_path / "a"))) is grpc.StatusCode.ABORTED
    )
    assert _code(lambda: c.delete_volume("v1")) is grpc.StatusCode.ABORTED
    c.node_unstage_volume("v2", str(tmp_path))  # another volume: not blocked
    gate.set()
    thread.join(10)
    assert outcome == [None]
    c.node_unpublish_volume("v1", str(tmp_path / "a"))  # free again


def test_create_volume_is_serialised_by_name(serve_driver: ServeFactory) -> None:
    """Two CreateVolume calls for one name: the second is ABORTED; another name proceeds."""
    served = serve_driver(SERIAL)
    c = served.client
    gate, thread, outcome = _hold(served, "CreateVolume", lambda: c.create_volume("n1", [CAP]))
    assert _code(lambda: c.create_volume("n1", [CAP])) is grpc.StatusCode.ABORTED
    served.driver.block.pop("CreateVolume")
    assert c.create_volume("n2", [CAP]).volume_id == "id-n2"
    gate.set()
    thread.join(10)
    assert isinstance(outcome[0], t.Volume)


def test_waiting_caller_gets_the_lock_within_the_timeout(
    serve_driver: ServeFactory, tmp_path: Path
) -> None:
    """With X_CSI_SERIAL_VOL_ACCESS_TIMEOUT the second call waits and then succeeds."""
    served = serve_driver({**SERIAL, "X_CSI_SERIAL_VOL_ACCESS_TIMEOUT": "10s"})
    c = served.client
    gate, thread, _ = _hold(
        served, "NodeStageVolume", lambda: c.node_stage_volume("v1", str(tmp_path), CAP)
    )
    served.driver.block.pop("NodeStageVolume")
    threading.Timer(0.3, gate.set).start()
    started = time.monotonic()
    c.node_stage_volume("v1", str(tmp_path), CAP)
    assert time.monotonic() - started >= 0.25
    thread.join(10)


def test_serial_access_off_lets_calls_overlap(served: Served, tmp_path: Path) -> None:
    """Without X_CSI_SERIAL_VOL_ACCESS two calls on one volume run together."""
    c = served.client
    gate, thread, _ = _hold(
        served, "NodePublishVolume", lambda: c.node_publish_volume("v1", str(tmp_path / "a"), CAP)
    )
    served.driver.block.pop("NodePublishVolume")
    c.node_publish_volume("v1", str(tmp_path / "b"), CAP)
    gate.set()
    thread.join(10)


def test_bad_serial_timeout_fails_at_start(serve_driver: ServeFactory) -> None:
    """A malformed X_CSI_SERIAL_VOL_ACCESS_TIMEOUT is refused before serving."""
    with pytest.raises(ServerConfigError, match="X_CSI_SERIAL_VOL_ACCESS_TIMEOUT"):
        serve_driver({**SERIAL, "X_CSI_SERIAL_VOL_ACCESS_TIMEOUT": "soon"})
