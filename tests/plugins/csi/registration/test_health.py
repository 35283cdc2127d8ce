"""Covers kubevol.plugins.csi.registration.watcher: health checks.

The plugin watcher's health checks, against a registrar in its own process that the tests
kill (``SIGKILL``: its socket stays) or freeze (``SIGSTOP``: its socket stays and accepts
connections nobody answers).

The facts come from the kubelet's plugin connection monitor
(``pkg/kubelet/pluginmanager/pluginwatcher/monitor.go``): registered plugins are asked
``GetInfo`` on their registration socket every 10 s (``defaultConnectionCheckInterval``),
each call within 10 s (``defaultGetInfoTimeout``); after 2 consecutive failures
(``DefaultMaxFailures``) the plugin is removed from the desired state and so deregistered;
a socket that answers again is added back and registered again.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from kubevol.csi.unixsocket import serve_on_unix_socket
from kubevol.plugins.csi.registration import PluginWatcher, registration_socket_path
from kubevol.plugins.csi.registration.watcher import (
    HEALTH_CHECK_INTERVAL,
    MAX_PING_FAILURES,
    RPC_TIMEOUT,
)
from kubevol.testing.waiting import wait_until
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME
from tests.plugins.csi.registration.conftest import Node

HERE = Path(__file__).parent


class Registrar:
    """``registrar_process.py`` for the node's driver, started and signalled by the test."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.socket = registration_socket_path(str(node.registry_dir), DRIVER_NAME)
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig=KILL", "--", sys.executable,
             str(HERE / "registrar_process.py"), "--socket", self.socket,
             "--name", DRIVER_NAME, "--endpoint", self.node.handle.address],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def registrar(node: Node) -> Iterator[Registrar]:
    """A registrar process for the node's driver, started."""
    reg = Registrar(node)
    try:
        reg.start()
        yield reg
    finally:
        reg.close()


def _pings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "failed GetInfo" in r.getMessage()]


def test_defaults_are_the_kubelets() -> None:
    """A ping every 10 s, each within 10 s, two failures in a row deregister."""
    assert (HEALTH_CHECK_INTERVAL, RPC_TIMEOUT, MAX_PING_FAILURES) == (10.0, 10.0, 2)
    watcher = PluginWatcher("/nonexistent", {})
    assert (watcher.health_check_interval, watcher.max_ping_failures) == (10.0, 2)


def test_at_least_one_failure_is_needed(node: Node) -> None:
    """max_ping_failures below 1 would deregister healthy plugins: refused."""
    with pytest.raises(ValueError, match="max_ping_failures must be at least 1, not 0"):
        PluginWatcher.for_registry(str(node.registry_dir), node.registry, max_ping_failures=0)


@pytest.mark.slow
def test_killed_registrar_is_deregistered_after_two_failed_pings_and_registered_again(
    node: Node, registrar: Registrar, caplog: pytest.LogCaptureFixture
) -> None:
    """After kill -9 of the registrar its socket stays; the first failed ping keeps the
    driver, the second deregisters it (NodeGetInfo is not asked again while the socket is
    dead); a registrar restarted on the same path registers the driver again."""
    watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry, rpc_timeout=2)
    watcher.sync()
    assert node.registry.is_registered(DRIVER_NAME)
    assert watcher.check_health() is False  # it answers
    registrar.kill()
    assert os.path.exists(registrar.socket)
    with caplog.at_level(logging.WARNING, logger="kubevol.plugins.csi.registration"):
        assert watcher.check_health() is False
        watcher.sync()
        assert node.registry.is_registered(DRIVER_NAME)  # one failure is not enough
        assert watcher.check_health() is True
        watcher.sync()
    assert not node.registry.is_registered(DRIVER_NAME)
    assert node.events == [("registered", DRIVER_NAME), ("deregistered", DRIVER_NAME)]
    pings = _pings(caplog)
    assert [p.split(" in a row")[0][-6:] for p in pings] == ["1 of 2", "2 of 2"]
    for line in pings:  # one line, the status, never gRPC's repr
        assert "\n" not in line and "debug_error_string" not in line
        assert f"socket {registrar.socket} failed GetInfo" in line and "UNAVAILABLE: " in line
    [known] = watcher.known()
    assert (known.registered, known.error) == (False, "no answer to 2 GetInfo pings in a row")
    asked = len(node.driver.requests("NodeGetInfo"))
    assert watcher.check_health() is False  # still dead: nothing to do
    watcher.sync()
    assert len(node.driver.requests("NodeGetInfo")) == asked
    registrar.start()  # removes the stale socket, serves a new one on the same path
    watcher.sync()
    assert node.registry.is_registered(DRIVER_NAME)
    assert len(node.driver.requests("NodeGetInfo")) == asked + 1
    assert [k.registered for k in watcher.known()] == [True]


@pytest.mark.slow
def test_frozen_registrar_is_deregistered_and_registered_again_when_it_answers(
    node: Node, registrar: Registrar
) -> None:
    """A registrar that stops answering on a socket that stays the same (SIGSTOP: no
    inotify event will ever come) is deregistered after two timed-out pings, and
    registered again as soon as a ping is answered (SIGCONT)."""
    watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry,
                                         rpc_timeout=0.5)
    watcher.sync()
    assert node.registry.is_registered(DRIVER_NAME)
    inode = os.stat(registrar.socket).st_ino
    registrar.signal(signal.SIGSTOP)
    try:
        watcher.check_health()
        assert watcher.check_health() is True
        watcher.sync()
        assert not node.registry.is_registered(DRIVER_NAME)
        assert watcher.check_health() is False
    finally:
        registrar.signal(signal.SIGCONT)
    assert watcher.check_health() is True
    watcher.sync()
    assert node.registry.is_registered(DRIVER_NAME)
    assert os.stat(registrar.socket).st_ino == inode
    assert node.events == [
        ("registered", DRIVER_NAME), ("deregistered", DRIVER_NAME), ("registered", DRIVER_NAME)
    ]


@pytest.mark.slow
def test_background_threads_deregister_a_killed_registrar_and_register_its_successor(
    node: Node, registrar: Registrar
) -> None:
    """With the watcher running, kill -9 of the registrar deregisters the driver after two
    ping periods without any file-system event, and a restarted registrar registers it
    again."""
    with PluginWatcher.for_registry(str(node.registry_dir), node.registry, rpc_timeout=1,
                                    resync_interval=60, health_check_interval=0.2):
        wait_until(lambda: node.registry.is_registered(DRIVER_NAME), 10, "registration")
        registrar.kill()
        wait_until(lambda: not node.registry.is_registered(DRIVER_NAME), 10, "deregistration")
        registrar.start()
        wait_until(lambda: node.registry.is_registered(DRIVER_NAME), 10, "re-registration")
    assert node.events == [
        ("registered", DRIVER_NAME), ("deregistered", DRIVER_NAME), ("registered", DRIVER_NAME)
    ]


def test_failed_registration_is_logged_in_one_line(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A socket that answers GetInfo with a gRPC error is logged as the status code and
    message on one line, not as the multi-line repr of gRPC's error object."""
    node.registry_dir.mkdir(parents=True)
    path = str(node.registry_dir / "other-reg.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # serves no service
    sock = serve_on_unix_socket(server, path, mode=0o600)
    try:
        watcher = PluginWatcher.for_registry(str(node.registry_dir), node.registry)
        with caplog.at_level(logging.ERROR, logger="kubevol.plugins.csi.registration"):
            watcher.sync()
    finally:
        server.stop(None).wait()
        sock.remove()
    assert [r.getMessage() for r in caplog.records] == [
        f"RegisterPlugin error at socket {path} (retrying in 0.5s): "
        "UNIMPLEMENTED: Method not found!"
    ]
