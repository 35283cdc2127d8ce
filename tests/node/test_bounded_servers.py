"""Covers kubevol.node.httpbounds and the agent's servers (exporter, agent_status, api_pods).

The agent's servers cannot be worn down (issue 28, point 7): the metrics server and the
status socket cut idle and slow connections, cap how many they serve, say nothing but a
debug line about clients that hang up; the API pod source backs off its relists and watch
restarts as client-go's reflector does."""

from __future__ import annotations

import json
import logging
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import attrs
import pytest

from kubevol.node.agent_status import StatusServer, ask_agent, status_socket_path
from kubevol.node.api_pods import APIServerPods
from kubevol.node.exporter import AgentMetrics, MetricsServer
from kubevol.node.httpbounds import ConnectionLimits
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.kube_api import KubeAPIServer
from kubevol.testing.waiting import wait_until

#: Short limits, so that the tests wait little.
LIMITS = ConnectionLimits(timeout=1.5, write_timeout=2.0, max_connections=16)
#: An answer far larger than a socket's buffers: the server is mid-answer when the client
#: hangs up.
BIG = 8 << 20
#: The unprivileged user that plays another user of the node.
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

#: Opens argv[2] connections to argv[1] (HOST:PORT, or a unix socket's path), prints
#: "first", waits for a line, opens argv[3] more, prints "second", then prints (JSON) how
#: long after its opening each connection was closed by the server (None: not in 10 s).
IDLE_CLIENT = r"""
import json, selectors, socket, sys, time
target, first, second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def connect():
    if target.startswith("/"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(target)
    else:
        host, port = target.rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    return s, time.monotonic()
socks = [connect() for _ in range(first)]
print("first", flush=True)
sys.stdin.readline()
socks += [connect() for _ in range(second)]
print("second", flush=True)
sel = selectors.DefaultSelector()
for i, (s, _) in enumerate(socks):
    sel.register(s, selectors.EVENT_READ, i)
closed = [None] * len(socks)
end = time.monotonic() + 10
while None in closed and time.monotonic() < end:
    for key, _ in sel.select(end - time.monotonic()):
        s, opened = socks[key.data]
        try:
            got = s.recv(1)
        except OSError:
            got = b""
        closed[key.data] = round(time.monotonic() - opened, 2) if got == b"" else "data"
        sel.unregister(s)
print(json.dumps(closed), flush=True)
"""


def handler_threads() -> int:
    """Threads serving a connection (socketserver's, in this process)."""
    return sum(1 for t in threading.enumerate() if t.name.endswith("(process_request_thread)"))


def _readable(sock: socket.socket, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        return bool(sel.select(timeout))


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset where there is one (TCP: SO_LINGER 0)."""
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@attrs.define
class Target:
    """A running server, as the tests reach it."""

    #: ``HOST:PORT`` or the unix socket's path.
    address: str
    #: A complete request for its main answer.
    request: bytes
    #: Whether it answers (within 1 s).
    answers: Callable[[], bool]
    #: Make that answer BIG bytes long.
    make_big: Callable[[], None]
    #: Who may connect (None: root only, the socket being 0600).
    other_user: list[str] | None

    def connect(self) -> socket.socket:
        if self.address.startswith("/"):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(self.address)
            return sock
        host, port = self.address.rsplit(":", 1)
        return socket.create_connection((host, int(port)))


def _fetch(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200 and resp.read())
    except urllib.error.HTTPError:
        return False


@pytest.fixture
def metrics_target(tmp_path: Path) -> Iterator[Target]:
    """A metrics server of a real AgentMetrics (on an empty root) with LIMITS."""
    problem: list[str | None] = [None]
    with NodeRuntime(str(tmp_path / "root"), node_name="n1", entry_points=False) as runtime:
        manager = NodeVolumeManager(runtime.host, runtime.mgr, workers=0)
        try:
            with MetricsServer("127.0.0.1:0", AgentMetrics(manager), lambda: problem[0],
                               limits=LIMITS) as server:
                base = f"http://{server.address}"

                def answers() -> bool:
                    return _fetch(f"{base}/metrics") and _fetch(f"{base}/healthz")

                def make_big() -> None:
                    problem[0] = "x" * BIG  # /healthz answers 503 with the reason

                yield Target(server.address, b"GET /healthz HTTP/1.0\r\n\r\n", answers,
                             make_big, NOBODY)
        finally:
            manager.close()


@pytest.fixture
def status_target(tmp_path: Path) -> Iterator[Target]:
    """The status socket of a root with LIMITS, answering ``rows``."""
    root = str(tmp_path / "root")
    rows: list[dict[str, Any]] = [{"pod": "p", "volume": "v"}]
    with StatusServer(root, lambda: rows, limits=LIMITS):

        def make_big() -> None:
            rows[:] = [{"pod": "x" * 1000}] * (BIG // 1000)

        yield Target(status_socket_path(root), b"GET /status HTTP/1.0\r\n\r\n",
                     lambda: ask_agent(root, timeout=1) == rows, make_big, None)


@pytest.fixture(params=["metrics", "status"])
def target(request: pytest.FixtureRequest) -> Target:
    """Each server in turn."""
    found: Target = request.getfixturevalue(f"{request.param}_target")
    return found


#: The system's Python, which any user can run (a virtualenv's may sit in root's home, and
#: a Python built with a shared libpython cannot load it as another user). Installed by
#: scripts/install-system-deps.sh; the client uses the standard library only.
OTHER_USERS_PYTHON = "/usr/bin/python3"


@pytest.mark.root
def test_idle_connections_are_capped_and_cut(target: Target) -> None:
    """Idle connections of another user: answers go on, threads stay capped, timeouts end them."""
    # (root's own connections for the status socket: it is 0600, nobody else can connect.)
    cap, first, second = LIMITS.max_connections, LIMITS.max_connections - 4, 12
    before = handler_threads()
    client = subprocess.Popen(
        [*(target.other_user or []), OTHER_USERS_PYTHON if target.other_user else sys.executable,
         "-I", "-c", IDLE_CLIENT, target.address,
         str(first), str(second)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdin is not None and client.stdout is not None
    try:
        assert client.stdout.readline() == "first\n"
        wait_until(lambda: handler_threads() >= before + first, 10, "the idle connections")
        started = time.monotonic()
        assert target.answers()
        assert time.monotonic() - started < 1.0
        wait_until(lambda: handler_threads() <= before + first, 10, "the answers done")

        client.stdin.write("\n")
        client.stdin.flush()
        assert client.stdout.readline() == "second\n"
        wait_until(lambda: handler_threads() >= before + cap, 1, "the cap reached")
        for _ in range(20):  # while the connections are held (within the timeout)
            assert handler_threads() <= before + cap
            time.sleep(0.01)

        closed = json.loads(client.stdout.readline())
    finally:
        client.kill()
        client.wait()
    assert None not in closed and "data" not in closed
    refused = sorted(closed)[: first + second - cap]
    served = sorted(closed)[first + second - cap:]
    assert max(refused) < 0.5  # over the cap: closed as soon as accepted
    assert LIMITS.timeout - 0.2 <= min(served) and max(served) <= LIMITS.timeout + 1.5
    wait_until(lambda: handler_threads() <= before, 10, "every connection's thread gone")
    assert target.answers()


#: The thread that serves each server (its accept loop).
SERVING_THREAD = {"metrics": "kubevol-metrics", "status": "kubevol-status"}


def _times_asleep(thread_name: str) -> int:
    """How many times the thread of that name went to sleep so far (its voluntary context
    switches: each one a wait that ended in a wake-up)."""
    (thread,) = [t for t in threading.enumerate() if t.name == thread_name]
    with open(f"/proc/self/task/{thread.native_id}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in the thread's status")


@pytest.mark.parametrize("server", sorted(SERVING_THREAD))
def test_an_idle_server_sleeps_until_a_client_comes(
    request: pytest.FixtureRequest, server: str
) -> None:
    """An idle server's accept loop does not wake to look for its stop (socketserver's
    polls twice a second): it wakes for a client (and for its stop)."""
    target: Target = request.getfixturevalue(f"{server}_target")
    assert target.answers()
    time.sleep(0.2)  # the answer's last wake-ups
    before = _times_asleep(SERVING_THREAD[server])
    time.sleep(1.6)
    assert _times_asleep(SERVING_THREAD[server]) == before
    assert target.answers()
    assert _times_asleep(SERVING_THREAD[server]) > before


@pytest.mark.slow
def test_a_request_dripped_a_byte_at_a_time_is_cut_at_the_deadline(target: Target) -> None:
    """A request dripped a byte at a time is cut at its deadline, not kept alive by each byte."""
    with target.connect() as sock:
        opened = time.monotonic()
        sock.sendall(target.request.split(b"\r\n")[0] + b"\r\n")
        cut = None
        while time.monotonic() - opened < LIMITS.timeout + 3:
            try:
                sock.sendall(b"X")
            except OSError:
                cut = time.monotonic() - opened
                break
            if _readable(sock, 0.25) and sock.recv(1) == b"":
                cut = time.monotonic() - opened
                break
    assert cut is not None, "still connected"
    assert LIMITS.timeout - 0.2 <= cut <= LIMITS.timeout + 1.0
    assert target.answers()


@pytest.mark.slow
def test_clients_that_hang_up_leave_no_traceback(
    target: Target, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hang-ups mid-request or mid-answer and silent clients cost debug lines, never a traceback."""
    caplog.set_level(logging.DEBUG, logger="kubevol")
    target.make_big()
    before = handler_threads()
    half = target.request[: len(target.request) // 2]
    for hang_up in (_reset, socket.socket.close):
        sock = target.connect()
        sock.sendall(half)
        hang_up(sock)
    silent = target.connect()
    mid_answer = target.connect()
    mid_answer.sendall(target.request)
    assert mid_answer.recv(100)
    _reset(mid_answer)
    assert _readable(silent, LIMITS.timeout + 1.0) and silent.recv(1) == b""
    silent.close()
    wait_until(lambda: handler_threads() <= before, 10, "every connection's thread gone")

    assert "Traceback" not in capsys.readouterr().err
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert "Traceback" not in caplog.text
    # The hang-ups did hit the server (the large answer's at least), as one debug line.
    assert [r for r in caplog.records if r.name == "kubevol.node.httpbounds"
            and r.levelno == logging.DEBUG and "went away" in r.message]
    with target.connect() as sock:
        sock.sendall(target.request)
        assert sock.recv(12).startswith(b"HTTP/1.0 ")


class ForgetfulAPI(KubeAPIServer):
    """The stand-in API server whose history is compacted past one more change as each
    watch starts, while :attr:`forgetting`: every watch is answered 410 Expired (an ERROR
    event), as when the server forgets faster than a client gets from its list to its watch."""

    forgetting = True

    def _watch(self, req: BaseHTTPRequestHandler, path: str, query: Mapping[str, str]) -> None:
        if self.forgetting:
            self.update("configmaps", "churn", {"data": {"n": str(self.resource_version)}},
                        "shop")
            self.compact()
        super()._watch(req, path, query)


@pytest.mark.slow
def test_relists_after_410_back_off_and_recover() -> None:
    """While every watch is answered 410, relists back off (0.8 s doubling); an event resets it."""
    with ForgetfulAPI() as api:
        api.add_config_map("shop", "churn", {"n": "0"})
        api.add({"kind": "Pod", "apiVersion": "v1",
                 "metadata": {"name": "web", "namespace": "shop"},
                 "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})
        with APIServerPods(api.api_client(), "n1", watch_timeout=30) as source:
            source.start()
            time.sleep(2.0)
            assert 2 <= source.lists <= 4  # at 0, 0.8 and 2.4 s; without backoff dozens

            # Remembering again: the next relist watches, and an event comes through it.
            api.forgetting = False
            assert api.wait_for_watches(1, 10)
            api.update("pods", "web", {"metadata": {"labels": {"a": "b"}}}, "shop")
            wait_until(lambda: source.resource_version == str(api.resource_version), 10,
                       "the event")
            # That watch breaks; resumed, it is told 410: the relist comes within 0.5 + 1.6
            # s (the count starts again), not after the 6.4 s or more it had reached.
            lists = source.lists
            api.forgetting = True
            api.drop_watches()
            wait_until(lambda: source.lists == lists + 1, 3.5, "the relist")


@pytest.mark.slow
def test_watches_that_end_at_once_back_off() -> None:
    """Watches that end at once without an event (timeoutSeconds=0) restart after a backoff."""
    with KubeAPIServer() as api, APIServerPods(api.api_client(), "n1",
                                                 watch_timeout=0) as source:
        source.start()
        time.sleep(2.0)
        assert 2 <= source.watches <= 4  # at 0, 0.8 and 2.4 s; without backoff dozens
        assert source.lists == 1
