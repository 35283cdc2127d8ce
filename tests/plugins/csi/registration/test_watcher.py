"""Covers kubevol.plugins.csi.registration.watcher and kubevol.plugins.csi.registration.server.

The plugin watcher speaking the kubelet's registration API to real registration sockets.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from kubevol.plugins.csi.registration import (
    PluginWatcher,
    RegistrationServer,
    RegistrationStatus,
    registration_socket_path,
    serve_registration,
)
from kubevol.testing.waiting import wait_until
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME, NODE_ID
from tests.plugins.csi.registration.conftest import Node


def test_watcher_registers_from_socket_and_deregisters_when_it_goes(node: Node) -> None:
    """A registration socket appearing in plugins_registry registers the driver (GetInfo,
    NodeGetInfo, NotifyRegistrationStatus true); removing the socket deregisters it. Both
    happen on inotify's word: the periodic re-scan is a minute away."""
    with PluginWatcher.for_registry(str(node.registry_dir), node.registry, resync_interval=60):
        server = serve_registration(node.handle, DRIVER_NAME, str(node.registry_dir))
        try:
            status = server.wait_for_status(10)
            assert status == RegistrationStatus(registered=True)
            driver = node.registry.get(DRIVER_NAME)
            assert driver.node_info.node_id == NODE_ID
            assert driver.endpoint == node.handle.endpoint.address  # a bare path, as sent
            assert server.socket_path == str(node.registry_dir / f"{DRIVER_NAME}-reg.sock")
        finally:
            server.stop()
        wait_until(lambda: not node.registry.is_registered(DRIVER_NAME))
    assert node.events == [("registered", DRIVER_NAME), ("deregistered", DRIVER_NAME)]


def _server(node: Node, versions: tuple[str, ...] = ("1.0.0",), plugin_type: str = "CSIPlugin",
            name: str = DRIVER_NAME) -> RegistrationServer:
    return RegistrationServer(
        driver_name=name, endpoint=node.handle.address, versions=versions,
        plugin_type=plugin_type,
        socket_path=registration_socket_path(str(node.registry_dir), name),
    ).start()


@pytest.mark.parametrize(
    ("versions", "plugin_type", "error"),
    [
        (("2.0",), "CSIPlugin", "RegisterPlugin error -- plugin validation failed with err: "
                                "validation failed for CSI Driver"),
        (("1.0.0",), "DRAPlugin", "RegisterPlugin error -- no handler registered for plugin "
                                  "type: DRAPlugin"),
    ],
)
def test_watcher_notifies_refusals(
    node: Node, versions: tuple[str, ...], plugin_type: str, error: str
) -> None:
    """A refused plugin is told why through NotifyRegistrationStatus and not registered."""
    watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry)
    server = _server(node, versions, plugin_type)
    try:
        watcher.sync()
        status = server.status
        assert status is not None and not status.registered
        assert status.error.startswith(error)
        assert not node.registry.is_registered(DRIVER_NAME)
    finally:
        server.stop()


def test_registration_failure_is_reported_and_kept_until_the_socket_changes(node: Node) -> None:
    """If NodeGetInfo fails the plugin is told; like the kubelet, the watcher does not retry
    that socket, but a re-created socket registers again."""
    import grpc

    node.driver.fail["NodeGetInfo"] = (grpc.StatusCode.UNAVAILABLE, "not yet")
    watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry)
    server = _server(node)
    try:
        watcher.sync()
        watcher.sync()
        assert server.wait_for_status(5) is not None
        status = server.status
        assert status is not None and not status.registered
        assert "plugin registration failed" in status.error and "NodeGetInfo" in status.error
        assert [k.registered for k in watcher.known()] == [False]
        assert len(node.driver.requests("NodeGetInfo")) == 1
    finally:
        server.stop()
    del node.driver.fail["NodeGetInfo"]
    watcher.sync()
    assert watcher.known() == []
    server = _server(node)
    try:
        watcher.sync()
        assert node.registry.is_registered(DRIVER_NAME)
    finally:
        server.stop()


def test_watcher_ignores_dot_files_and_non_sockets(node: Node) -> None:
    """Regular files and sockets whose names start with '.' are not registration sockets."""
    node.registry_dir.mkdir(parents=True)
    (node.registry_dir / "notes.txt").write_text("hello")
    hidden = socket.socket(socket.AF_UNIX)
    hidden.bind(str(node.registry_dir / ".hidden.sock"))
    try:
        watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry)
        watcher.sync()
        assert watcher.known() == []
    finally:
        hidden.close()
        os.unlink(node.registry_dir / ".hidden.sock")


def test_dead_socket_is_retried_with_backoff(node: Node) -> None:
    """A socket nobody answers on is not registered and is retried later, not every pass."""
    node.registry_dir.mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(node.registry_dir / "dead-reg.sock"))  # bound, never listening
    try:
        watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry,
                                             rpc_timeout=0.2)
        started = time.monotonic()
        watcher.sync()
        watcher.sync()  # inside the backoff: no second dial
        assert time.monotonic() - started < 0.35
        assert watcher.known() == []
    finally:
        dead.close()


def test_sockets_in_hidden_directories_are_ignored(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A socket inside a directory whose name starts with '.' (where a server binds before
    linking the socket into place) is never dialled."""
    hidden = node.registry_dir / ".kubevol-sock-x"
    hidden.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(hidden / "s"))
        watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry)
        with caplog.at_level(logging.DEBUG, logger="kubevol.plugins.csi.registration"):
            watcher.sync()
        assert watcher.known() == []
        assert "RegisterPlugin" not in caplog.text  # it was not even tried
    finally:
        sock.close()
