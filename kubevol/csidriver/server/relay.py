"""Serving on a listening socket somebody else opened (systemd socket activation, a test
harness, gocsi's ``Serve(ctx, listener)``).

grpcio cannot take a listening file descriptor, so the server listens on a private unix
socket and a :class:`ListenerRelay` accepts on the given listener and copies each
connection's bytes to and from that socket. CSI calls are small and few, so the copy costs
little; drivers that care serve on their own socket instead.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading

_log = logging.getLogger("kubevol.csidriver.server")

_CHUNK = 1 << 16


def _pump(client: socket.socket, backend: socket.socket) -> None:
    """Copy both ways until both sides have finished sending; then close both."""
    open_sides = {client: backend, backend: client}
    try:
        while open_sides:
            readable, _, _ = select.select(list(open_sides), [], [])
            for src in readable:
                dst = open_sides[src]
                try:
                    data = src.recv(_CHUNK)
                except OSError:
                    data = b""
                if data:
                    dst.sendall(data)
                    continue
                del open_sides[src]
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        client.close()
        backend.close()


class ListenerRelay:
    """Accepts on ``listener`` (bound and listening) and relays every connection to the
    unix socket at ``backend_path``. :meth:`stop` closes the listener and the relayed
    connections."""

    def __init__(self, listener: socket.socket, backend_path: str) -> None:
        self.listener = listener
        self.backend_path = backend_path
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name="csi-relay", daemon=True)

    def start(self) -> None:
        """Start accepting."""
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed: stopping
            try:
                backend = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                backend.connect(self.backend_path)
            except OSError as exc:
                _log.error("cannot relay a connection to %s: %s", self.backend_path, exc)
                client.close()
                continue
            with self._lock:
                if self._stopped:
                    client.close()
                    backend.close()
                    return
                self._connections |= {client, backend}
            threading.Thread(
                target=self._relay, args=(client, backend), name="csi-relay-conn", daemon=True
            ).start()

    def _relay(self, client: socket.socket, backend: socket.socket) -> None:
        try:
            _pump(client, backend)
        finally:
            with self._lock:
                self._connections -= {client, backend}

    def stop(self) -> None:
        """Stop accepting, close the listener and every relayed connection. Idempotent."""
        with self._lock:
            self._stopped = True
            connections = list(self._connections)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
