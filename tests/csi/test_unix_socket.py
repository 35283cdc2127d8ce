"""Covers kubevol.csi.unixsocket.

Serving on unix sockets: the socket appears only when it serves, with its final mode; a
stopping server never removes a socket it did not publish; an already-open listener and
gRPC server options are honoured."""

from __future__ import annotations

import os
import socket
import stat
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError, CSIServeError
from kubevol.csi.unixsocket import serve_on_unix_socket
from kubevol.csidriver.server import serve_in_background
from tests.csi.support import make_plugin


class WatchedServer:
    """A real grpc server that records what the socket path looked like when it started."""

    def __init__(self, path: Path) -> None:
        self.real = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.path = path
        self.seen_at_start: bool | None = None

    def add_insecure_port(self, address: str) -> int:
        port: int = self.real.add_insecure_port(address)
        return port

    def start(self) -> None:
        self.seen_at_start = self.path.exists()
        self.real.start()

    def stop(self, grace: float | None) -> Any:
        return self.real.stop(grace)


def test_socket_appears_only_once_serving_with_its_final_mode(tmp_path: Path) -> None:
    """The path does not exist while the server starts (no window between bind, chmod and
    serve), exists afterwards with the asked mode, and nothing else is left next to it."""
    path = tmp_path / "csi.sock"
    server = WatchedServer(path)
    published = serve_on_unix_socket(server, str(path), mode=0o640)
    try:
        assert server.seen_at_start is False
        assert path.is_socket() and stat.S_IMODE(path.lstat().st_mode) == 0o640
        assert sorted(os.listdir(tmp_path)) == ["csi.sock"]
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))  # a client that finds the path connects at once
        probe.close()
    finally:
        server.stop(None).wait()
        published.remove()
    assert not path.exists()


def test_a_stopping_server_leaves_its_successors_socket(tmp_path: Path) -> None:
    """An old server that stops after a new one took over the path (it stopped listening,
    the new one found its socket stale) does not remove the new socket, which keeps
    serving. gRPC itself would have unlinked the path it bound."""
    endpoint = f"unix://{tmp_path / 'csi.sock'}"
    old_plugin, _ = make_plugin()
    old = serve_in_background(old_plugin, endpoint, env={})
    old.server.stop(None).wait()  # the old process has stopped listening, not cleaned up
    new_plugin, _ = make_plugin()
    new = serve_in_background(new_plugin, endpoint, env={})
    try:
        old.stop()
        assert (tmp_path / "csi.sock").is_socket()
        with CSIClient(endpoint, timeout=10) as client:
            assert client.probe()
    finally:
        new.stop(grace=1)
    assert not (tmp_path / "csi.sock").exists()


def test_too_long_a_path_is_refused_clearly(tmp_path: Path) -> None:
    """A socket path over the kernel's 107 bytes fails with a message saying so."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    plugin, _ = make_plugin()
    with pytest.raises(CSIServeError, match="limited to 107 bytes"):
        serve_in_background(plugin, str(deep / "csi.sock"), env={})


def test_serving_on_an_already_open_listener(tmp_path: Path) -> None:
    """A listening socket opened by the caller (socket activation) is served; the handle
    reports its address and stopping closes it."""
    path = tmp_path / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    plugin, _ = make_plugin()
    handle = serve_in_background(plugin, env={}, listener=listener)
    try:
        assert handle.address == f"unix://{path}"
        with CSIClient(handle.address, timeout=10) as client:
            for _ in range(3):
                assert client.probe()
            assert client.get_plugin_info().name
    finally:
        handle.stop(grace=1)
    assert listener.fileno() == -1


def test_grpc_server_options_apply(tmp_path: Path) -> None:
    """gRPC server options (here a 1 KiB receive limit) reach the server."""
    plugin, _ = make_plugin()
    handle = serve_in_background(
        plugin,
        f"unix://{tmp_path / 'csi.sock'}",
        env={},
        options=[("grpc.max_receive_message_length", 1024)],
    )
    try:
        with CSIClient(handle.address, timeout=10) as client:
            assert client.probe()
            with pytest.raises(CSIRPCError) as err:
                client.node_unpublish_volume("v" * 4096, "/t")
            assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        handle.stop(grace=1)
