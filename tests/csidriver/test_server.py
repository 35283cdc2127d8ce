"""Covers kubevol.csidriver.server.serve.

The serving side: modes, sockets, permissions, hooks, interceptors, shutdown.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import signal
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIEndpointError, CSIRPCError, CSIServeError
from kubevol.csidriver.server import (
    CallInfo,
    Middleware,
    ServerConfig,
    ServerConfigError,
    StoragePlugin,
    current_request_id,
    serve_in_background,
)
from tests.csi.support import ProcessFactory, ServeFactory, make_plugin, wait_for_file

CAP = t.VolumeCapability.mount()


def test_controller_mode_serves_no_node_service(serve_driver: ServeFactory) -> None:
    """X_CSI_MODE=controller: Identity and Controller answer, Node is UNIMPLEMENTED."""
    c = serve_driver({"X_CSI_MODE": "controller"}).client
    assert c.get_plugin_info().name
    assert c.create_volume("n", [CAP]).volume_id == "id-n"
    with pytest.raises(CSIRPCError) as err:
        c.node_get_info()
    assert err.value.code is grpc.StatusCode.UNIMPLEMENTED


def test_node_mode_serves_no_controller_service(serve_driver: ServeFactory) -> None:
    """X_CSI_MODE=node: Node answers, Controller and GroupController are UNIMPLEMENTED."""
    c = serve_driver({"X_CSI_MODE": "node"}).client
    assert c.node_get_info().node_id
    for call in (lambda: c.create_volume("n", [CAP]), c.group_controller_get_capabilities):
        with pytest.raises(CSIRPCError) as err:
            call()
        assert err.value.code is grpc.StatusCode.UNIMPLEMENTED


def test_unexpected_driver_exception_is_internal(serve_driver: ServeFactory) -> None:
    """A driver bug (any exception) answers INTERNAL naming the exception."""

    def broken(request: Any, context: Any) -> Any:
        raise KeyError("lost")

    plugin, driver = make_plugin()
    assert plugin.node is not None
    plugin.node.node_get_info = broken  # type: ignore[method-assign]  # patch one instance
    broken_served = serve_driver(plugin=plugin, driver=driver, socket_name="b.sock")
    with pytest.raises(CSIRPCError) as err:
        broken_served.client.node_get_info()
    assert err.value.code is grpc.StatusCode.INTERNAL
    assert "KeyError" in err.value.message


def test_not_implemented_error_is_unimplemented(serve_driver: ServeFactory) -> None:
    """A driver method raising NotImplementedError answers UNIMPLEMENTED."""

    def later(request: Any, context: Any) -> Any:
        raise NotImplementedError("coming soon")

    plugin, driver = make_plugin()
    assert plugin.node is not None
    plugin.node.node_get_info = later  # type: ignore[method-assign]  # patch one instance
    served = serve_driver(plugin=plugin, driver=driver)
    with pytest.raises(CSIRPCError) as err:
        served.client.node_get_info()
    assert (err.value.code, err.value.message) == (grpc.StatusCode.UNIMPLEMENTED, "coming soon")


def test_driver_calling_context_abort_keeps_its_status(
    serve_driver: ServeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver that aborts through the gRPC context keeps its code; logging reports it."""

    def gone(request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.NOT_FOUND, "volume gone")

    plugin, driver = make_plugin()
    assert plugin.node is not None
    plugin.node.node_unstage_volume = gone  # type: ignore[method-assign]  # patch one instance
    served = serve_driver({"X_CSI_REP_LOGGING": "1"}, plugin=plugin, driver=driver)
    caplog.set_level(logging.INFO)
    with pytest.raises(CSIRPCError) as err:
        served.client.node_unstage_volume("v1", "/staging")
    assert (err.value.code, err.value.message) == (grpc.StatusCode.NOT_FOUND, "volume gone")
    assert "error NOT_FOUND: volume gone" in caplog.text


def test_stale_socket_is_removed_before_listening(
    serve_driver: ServeFactory, tmp_path: Path
) -> None:
    """A socket file left by a dead process is replaced; gocsi would fail here."""
    path = tmp_path / "csi.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens
    assert path.is_socket()
    assert serve_driver().client.probe()


def test_live_socket_is_not_taken_over(serve_driver: ServeFactory, tmp_path: Path) -> None:
    """Serving on a socket another server answers on fails; the first keeps working."""
    first = serve_driver()
    plugin, _ = make_plugin()
    with pytest.raises(CSIServeError, match="another process"):
        serve_in_background(plugin, f"unix://{tmp_path / 'csi.sock'}", env={})
    assert first.client.probe()


def test_non_socket_file_is_never_removed(tmp_path: Path) -> None:
    """A regular file where the socket should be is refused and left intact."""
    path = tmp_path / "csi.sock"
    path.write_text("data")
    plugin, _ = make_plugin()
    with pytest.raises(CSIServeError, match="not a socket"):
        serve_in_background(plugin, str(path), env={})
    assert path.read_text() == "data"


def test_socket_permissions_default_and_configured(
    serve_driver: ServeFactory, tmp_path: Path
) -> None:
    """The socket is 0755 by default and X_CSI_ENDPOINT_PERMS sets it."""
    serve_driver()
    assert stat.S_IMODE(os.stat(tmp_path / "csi.sock").st_mode) == 0o755
    serve_driver({"X_CSI_ENDPOINT_PERMS": "0600"}, socket_name="other.sock")
    assert stat.S_IMODE(os.stat(tmp_path / "other.sock").st_mode) == 0o600


def test_socket_owner_from_user_and_group(serve_driver: ServeFactory, tmp_path: Path) -> None:
    """X_CSI_ENDPOINT_USER/_GROUP (names or numbers) own the socket."""
    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(nobody.pw_gid)
    serve_driver({"X_CSI_ENDPOINT_USER": "nobody", "X_CSI_ENDPOINT_GROUP": group.gr_name})
    info = os.stat(tmp_path / "csi.sock")
    assert (info.st_uid, info.st_gid) == (nobody.pw_uid, group.gr_gid)
    serve_driver({"X_CSI_ENDPOINT_USER": str(nobody.pw_uid)}, socket_name="n.sock")
    assert os.stat(tmp_path / "n.sock").st_uid == nobody.pw_uid
    with pytest.raises(CSIServeError, match="X_CSI_ENDPOINT_USER"):
        serve_driver({"X_CSI_ENDPOINT_USER": "no-such-user-kv"}, socket_name="x.sock")
    assert not (tmp_path / "x.sock").exists()


@pytest.mark.slow
def test_stop_drains_and_removes_the_socket(serve_driver: ServeFactory, tmp_path: Path) -> None:
    """stop() lets an in-flight call finish, then removes the socket; it is idempotent."""
    served = serve_driver()
    served.driver.sleep["NodeStageVolume"] = 0.5
    results: list[str] = []

    def stage() -> None:
        served.client.node_stage_volume("v", str(tmp_path), CAP)
        results.append("ok")

    thread = threading.Thread(target=stage)
    thread.start()
    time.sleep(0.2)
    served.handle.stop(grace=5)
    thread.join(5)
    assert results == ["ok"]
    assert not (tmp_path / "csi.sock").exists()
    served.handle.stop()


def test_before_serve_hook_runs_first_and_can_refuse(tmp_path: Path) -> None:
    """before_serve sees the configuration; raising there means no socket is created."""
    seen: list[ServerConfig] = []

    def hook(plugin: StoragePlugin, config: ServerConfig) -> None:
        seen.append(config)
        raise RuntimeError("not today")

    plugin, _ = make_plugin(before_serve=hook)
    with pytest.raises(RuntimeError, match="not today"):
        serve_in_background(plugin, str(tmp_path / "csi.sock"), env={"X_CSI_MODE": "node"})
    assert seen[0].mode.value == "node"
    assert not (tmp_path / "csi.sock").exists()


class Recorder(Middleware):
    """A plugin interceptor: records what it saw and can deny calls."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def handle(self, call: CallInfo, request: Any, context: Any, proceed: Any) -> Any:
        if call.rpc.name == "DeleteVolume":
            raise CSIRPCError(grpc.StatusCode.PERMISSION_DENIED, "no deletes here")
        try:
            result = proceed(request)
        except CSIRPCError as exc:
            self.seen.append((call.rpc.name, current_request_id(), exc.code.name))
            raise
        self.seen.append((call.rpc.name, current_request_id(), "OK"))
        return result


def test_plugin_interceptors_sit_outside_kubevol_middleware(serve_driver: ServeFactory) -> None:
    """Extra interceptors run before request ids and see validation failures as exceptions."""
    recorder = Recorder()
    plugin, driver = make_plugin(interceptors=(recorder,))
    served = serve_driver(
        {"X_CSI_REQ_LOGGING": "1", "X_CSI_SPEC_VALIDATION": "1"}, plugin=plugin, driver=driver
    )
    c = served.client
    c.node_get_info()
    with pytest.raises(CSIRPCError) as err:
        c.node_unstage_volume("", "/s")
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(CSIRPCError) as err2:
        c.delete_volume("v1")
    assert err2.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert recorder.seen == [
        ("NodeGetInfo", "", "OK"),
        ("NodeUnstageVolume", "", "INVALID_ARGUMENT"),
    ]
    assert driver.seen_request_ids == ["0001"]


def test_env_defaults_apply_unless_the_environment_overrides(serve_driver: ServeFactory) -> None:
    """StoragePlugin.env_defaults fill in variables the environment leaves unset."""
    plugin, driver = make_plugin(env_defaults={"X_CSI_PLUGIN_INFO": "default.example.com, 1"})
    served = serve_driver({}, plugin=plugin, driver=driver)
    assert served.client.get_plugin_info().name == "default.example.com"
    plugin2, driver2 = make_plugin(env_defaults={"X_CSI_PLUGIN_INFO": "default.example.com, 1"})
    served2 = serve_driver(
        {"X_CSI_PLUGIN_INFO": "env.example.com, 2"},
        plugin=plugin2,
        driver=driver2,
        socket_name="2.sock",
    )
    assert served2.client.get_plugin_info().name == "env.example.com"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("X_CSI_MODE", "sideways"),
        ("X_CSI_ENDPOINT_PERMS", "0999"),
        ("X_CSI_REQ_LOGGING", "maybe"),
        ("X_CSI_MAX_PATH_LIMIT", "-1"),
    ],
)
def test_bad_variables_are_refused(variable: str, value: str) -> None:
    """Malformed framework variables raise ServerConfigError naming the variable."""
    with pytest.raises(ServerConfigError, match=variable):
        ServerConfig.from_env({variable: value})


def test_bad_etcd_lock_settings_are_refused_before_serving(tmp_path: Path) -> None:
    """A malformed X_CSI_SERIAL_VOL_ACCESS_ETCD_* variable fails start-up; no socket is left."""
    plugin, _ = make_plugin()
    env = {
        "X_CSI_SERIAL_VOL_ACCESS": "true",
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS": "127.0.0.1:2379",
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL": "forever",
    }
    with pytest.raises(ServerConfigError, match="X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL"):
        serve_in_background(plugin, str(tmp_path / "csi.sock"), env=env)
    assert not (tmp_path / "csi.sock").exists()


def test_missing_endpoint_is_refused() -> None:
    """Without CSI_ENDPOINT or an explicit endpoint there is nothing to serve on."""
    plugin, _ = make_plugin()
    with pytest.raises(CSIEndpointError, match="CSI_ENDPOINT"):
        serve_in_background(plugin, env={})


@pytest.mark.slow
def test_sigterm_drains_in_flight_calls_then_removes_socket(
    driver_process: ProcessFactory, tmp_path: Path
) -> None:
    """A driver process stops on SIGTERM only after its in-flight call answered OK."""
    sock = tmp_path / "proc.sock"
    entered = tmp_path / "entered"
    entered.mkdir()
    proc = driver_process(
        sock, {}, "--sleep", "NodePublishVolume=1.0", "--entered-dir", str(entered)
    )
    results: list[str] = []
    with CSIClient(str(sock), timeout=20) as client:

        def publish() -> None:
            client.node_publish_volume("v1", str(tmp_path / "t"), CAP)
            results.append("ok")

        thread = threading.Thread(target=publish)
        thread.start()
        wait_for_file(entered / "NodePublishVolume")
        proc.send_signal(signal.SIGTERM)
        thread.join(10)
    assert results == ["ok"]
    assert proc.wait(timeout=10) == 0
    assert not sock.exists()
