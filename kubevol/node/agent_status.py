"""The running agent's read-only status endpoint: HTTP over a unix socket under the root
(``<root>/kubevol/agent.sock``, in the root-only state directory), so that ``kubevol status``
asks the agent what it runs instead of scanning the root again.

``GET /status`` answers ``{"pid": …, "volumes": [row, …]}``; the rows are whatever the
agent's ``rows()`` callback gives (the CLI builds them, in the shape ``kubevol status``
prints). Until ``ready()`` (the agent's first reconcile pass) it answers 503: what it knows
then is not yet what is on disk. Nothing else is served and nothing is changed through it.
A socket left by an agent that died answers nothing (connection refused): the caller falls
back to scanning. Slow, idle and surplus connections are cut as
:mod:`kubevol.node.httpbounds` says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING

from kubevol.node.records import STATE_DIR
from kubevol.util.lifecycle import RunsWhileEntered

if TYPE_CHECKING:
    from kubevol.node.httpbounds import BoundedServer, ConnectionLimits

log = logging.getLogger(__name__)

#: The socket's name in the root's state directory.
SOCKET_NAME = "agent.sock"


def status_socket_path(root_dir: str) -> str:
    """Where the agent of ``root_dir`` serves its status."""
    return os.path.join(root_dir, STATE_DIR, SOCKET_NAME)


class StatusServer(RunsWhileEntered):
    """Serves ``rows()`` at ``GET /status`` on the status socket of ``root_dir``, within
    ``limits`` (None: :data:`kubevol.node.httpbounds.DEFAULT_LIMITS`)."""

    def __init__(
        self, root_dir: str, rows: Callable[[], Sequence[Mapping[str, object]]],
        ready: Callable[[], bool] = lambda: True, *, limits: ConnectionLimits | None = None,
    ) -> None:
        self.path = status_socket_path(root_dir)
        self.rows = rows
        self.ready = ready
        self.limits = limits
        self._server: BoundedServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> StatusServer:
        # Loaded here: `kubevol status` imports this module for ask_agent, and http.server
        # is most of what importing it would cost.
        import socketserver

        from kubevol.node.httpbounds import DEFAULT_LIMITS, BoundedHandler, BoundedServer

        class UnixHTTPServer(BoundedServer, socketserver.UnixStreamServer):
            name = "status socket"

        outer = self

        class Handler(BoundedHandler):
            def log_message(self, format: str, *args: object) -> None:
                log.debug("status socket: " + format, *args)

            def address_string(self) -> str:
                return "local"  # a unix socket peer has no address

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/status":
                    self._answer(HTTPStatus.NOT_FOUND, {"error": "not found"})
                    return
                if not outer.ready():
                    self._answer(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "not ready"})
                    return
                try:
                    body = {"pid": os.getpid(), "volumes": outer.rows()}
                except Exception as exc:  # a bad answer must not kill the agent
                    log.exception("status request failed")
                    self._answer(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc)})
                    return
                self._answer(HTTPStatus.OK, body)

            def _answer(self, status: HTTPStatus, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        # The previous agent's socket (it held the root lock we hold now) is stale.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = UnixHTTPServer(self.path, Handler, limits=self.limits or DEFAULT_LIMITS)
        os.chmod(self.path, 0o600)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="kubevol-status", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self._thread is not None:
            self._thread.join()
            self._thread = None


#: The largest answer read from the agent (a row is ~300 bytes: room for 100k volumes).
MAX_ANSWER = 64 << 20


def _request(path: str, timeout: float) -> tuple[int, bytes]:
    """``GET /status`` over the socket at ``path`` (HTTP/1.0: the server closes after the
    answer); the status code and body. Raises OSError or ValueError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(b"GET /status HTTP/1.0\r\nHost: localhost\r\n\r\n")
        chunks, size = [], 0
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                raise ValueError(f"the answer is larger than {MAX_ANSWER} bytes")
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or not status_line[0].startswith(b"HTTP/"):
        raise ValueError("not an HTTP answer")
    return int(status_line[1]), body


def ask_agent(root_dir: str, timeout: float = 5.0) -> list[dict[str, object]] | None:
    """The volume rows of the agent running on ``root_dir``; None when none answers (no
    socket, a stale one, a timeout or a bad answer)."""
    path = status_socket_path(root_dir)
    if not os.path.exists(path):
        return None
    try:
        code, data = _request(path, timeout)
        if code != HTTPStatus.OK:
            log.info("the agent's status socket answered %s: scanning", code)
            return None
        body = json.loads(data)
    except (OSError, ValueError) as exc:
        log.info("no agent answers on %s (%s): scanning", path, exc)
        return None
    rows = body.get("volumes") if isinstance(body, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return None
    return rows
