"""Bounds for the agent's small HTTP servers (``/metrics`` and ``/healthz``; the status
socket), which anyone on the node can connect to (and, for the metrics address, anyone who
can reach it): however many connections they open and however slowly they talk, the agent
spends a bounded number of threads and descriptors, for a bounded time, and its log stays
quiet.

- **One deadline per request.** The request line and headers must all have arrived
  :attr:`ConnectionLimits.timeout` seconds after the server started waiting for them: one
  deadline for every read, not a fresh one per read, so a client that drips a byte at a time
  is cut as surely as one that sends nothing. The answer must then be taken within
  :attr:`ConnectionLimits.write_timeout` (a client that stops reading is cut too). A client
  cut for slowness is closed with one debug line (the handler's ``log_message``).
- **A cap on connections.** At most :attr:`ConnectionLimits.max_connections` are served
  at once (each holds a thread and a descriptor). One over the cap is closed as soon as it
  is accepted, unanswered: no thread, and no 503 either (writing an answer from the
  accepting thread could block it on a client that does not read). Each slot frees within
  ``timeout + write_timeout``, so honest clients are served again after that at worst.
- **No tracebacks for clients that go away.** A client that hangs up or times out
  (``ConnectionError``: a broken pipe or a reset; ``TimeoutError``) costs one debug line;
  anything else a handler raises is logged once, as an error with its traceback, instead of
  socketserver's print to stderr.

A server is a :class:`BoundedServer` mixed before its socketserver base, with a
:class:`BoundedHandler` handler; :meth:`BoundedServer.server_close` does not wait for
connections still open (each ends on its own within the limits). An idle server's thread
sleeps until a connection comes or :meth:`BoundedServer.shutdown` pokes it: socketserver's
own loop wakes twice a second to look for its stop flag.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, TypeAlias, cast

import attrs

from kubevol.util.wakeup import WakePipe

if TYPE_CHECKING:
    from _typeshed import HasFileno, WriteableBuffer

#: What socketserver hands a server for one connection (a datagram server's: the data and
#: the socket).
Request: TypeAlias = socket.socket | tuple[bytes, socket.socket]

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class ConnectionLimits:
    """How long and how many (see the module)."""

    #: Seconds for a request's line and headers to arrive, all of them. Loopback and LAN
    #: clients (a scraper, a health checker, ``kubevol status``) send them in milliseconds;
    #: 5 s leaves room for a slow network without letting an idle connection stay.
    timeout: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    #: Seconds for the client to take the answer (Prometheus' default scrape timeout is
    #: 10 s; an answer of a few megabytes for a node with very many volumes fits in 30).
    write_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    #: Connections served at once: many times what a node's scrapers and health checks
    #: need, few enough threads that nobody can wear the agent down with them.
    max_connections: int = attrs.field(default=64, validator=attrs.validators.gt(0))


DEFAULT_LIMITS = ConnectionLimits()


def _peer(client_address: object) -> str:
    """``HOST:PORT`` of a TCP peer; ``local`` for a unix socket's (it has no address)."""
    if isinstance(client_address, tuple) and len(client_address) >= 2:
        return f"{client_address[0]}:{client_address[1]}"
    return "local"


class BoundedServer(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """A thread per connection, at most ``limits.max_connections`` of them; mix it before
    the server class (``class S(BoundedServer, HTTPServer)``) and pass ``limits=``."""

    daemon_threads = True
    #: Stopping does not wait for open connections: each ends within the limits.
    block_on_close = False
    #: What the log calls this server.
    name = "server"

    def __init__(self, server_address: str | tuple[str, int],
                 handler_class: type[socketserver.BaseRequestHandler], *,
                 limits: ConnectionLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        # A burst up to the cap waits in the kernel to be accepted, not in SYN retries
        # (socketserver listens with a backlog of 5).
        self.request_queue_size = limits.max_connections
        super().__init__(server_address, handler_class)
        # shutdown() pokes it: serve_forever waits on it and the socket, no timeout.
        self._stop = WakePipe()
        # As socketserver's: unset until a serve_forever ends, so that a shutdown() right
        # after the serving thread started waits for it (and the pipe is not closed under it).
        self._serving_ended = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until :meth:`shutdown`, waking only for a connection or for it.
        socketserver's loop wakes every ``poll_interval`` (ignored here) to look for its
        stop flag; on this kind of machine each wake-up of an idle thread costs ~0.1 ms of
        CPU, which for the status socket was an eighth of an idle agent's CPU outside its
        stats refresh."""
        try:
            with selectors.DefaultSelector() as selector:
                # Every socket server has fileno() (typeshed gives BaseServer none).
                selector.register(cast("HasFileno", self), selectors.EVENT_READ)
                selector.register(self._stop, selectors.EVENT_READ)
                while True:
                    ready = [key.fileobj for key, _ in selector.select()]
                    if self._stop in ready:
                        return
                    # What socketserver's own loop calls once the socket is ready: accept
                    # without waiting (handle_request() would wait again, on the socket
                    # alone, if the client went before the accept).
                    self._handle_request_noblock()  # type: ignore[attr-defined]
                    self.service_actions()
        finally:
            self._serving_ended.set()

    def shutdown(self) -> None:
        """Make :meth:`serve_forever` (running, or started, on another thread) return, and
        wait until it did (as socketserver's, it must be); a later :meth:`serve_forever`
        returns at once."""
        self._stop.poke()
        self._serving_ended.wait()

    def server_close(self) -> None:
        """Close the listening socket and the wake-up pipe. Idempotent."""
        super().server_close()
        self._stop.close()

    def verify_request(self, request: Request, client_address: object) -> bool:
        """Take a slot, or refuse the connection (socketserver then closes it)."""
        if not super().verify_request(request, client_address):
            return False
        if not self._slots.acquire(blocking=False):
            log.debug("%s: %d connections open, closing a new one from %s", self.name,
                      self.limits.max_connections, _peer(client_address))
            return False
        return True

    def process_request(self, request: Request, client_address: object) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread was started to release it
            raise

    def process_request_thread(self, request: Request, client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Request, client_address: object) -> None:
        """A client that went away is one debug line; anything else one error."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("%s: client %s went away: %s", self.name, _peer(client_address),
                      exc.strerror or type(exc).__name__)
            return
        log.error("%s: a request from %s failed", self.name, _peer(client_address),
                  exc_info=True)


class _DeadlineReader(io.RawIOBase):
    """Reads of a connection, each allowed only what is left until :attr:`deadline`
    (None: the socket's own timeout applies)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class BoundedHandler(BaseHTTPRequestHandler):
    """A handler whose requests must arrive, and answers be taken, within its server's
    :class:`ConnectionLimits` (the defaults on a server that is no :class:`BoundedServer`)."""

    @property
    def limits(self) -> ConnectionLimits:
        server = self.server
        return server.limits if isinstance(server, BoundedServer) else DEFAULT_LIMITS

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own reader, replaced by one that keeps the deadline
        self._reads = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        # The deadline starts when the server starts waiting; a TimeoutError (from the
        # deadline or a write) ends in the base class' "Request timed out" (log_message).
        self._reads.deadline = time.monotonic() + self.limits.timeout
        super().handle_one_request()

    def parse_request(self) -> bool:
        # Headers read (or the request refused): the answer (and a body, for a server that
        # reads one: each read) gets the write timeout.
        parsed = super().parse_request()
        self._reads.deadline = None
        self.connection.settimeout(self.limits.write_timeout)
        return parsed
