"""A real, single-member etcd server on loopback for tests.

Usage from a pytest fixture in any test directory::

    @pytest.fixture(scope="module")
    def etcd(tmp_path_factory):
        with EtcdServer(tmp_path_factory.mktemp("etcd")) as server:
            yield server

The server listens on free loopback ports, keeps its data in a fresh directory under the
given one, and is stopped by PID (SIGTERM, then SIGKILL). It runs with short raft timers
(heartbeat 20 ms, election 200 ms), which make it start in well under a second; they also
lower etcd's minimum lease TTL to 1 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from kubevol.util.lifecycle import RunsWhileEntered

ETCD_BINARY = "/usr/bin/etcd"


class EtcdStartError(RuntimeError):
    """etcd did not become healthy; the message carries the tail of its log."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EtcdServer(RunsWhileEntered):
    """One etcd process. :meth:`start` blocks until healthy; :meth:`stop` is idempotent."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        binary: str = ETCD_BINARY,
        extra_args: Sequence[str] = (),
        start_timeout: float = 30.0,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.binary = binary
        self.extra_args = tuple(extra_args)
        self.start_timeout = start_timeout
        self.client_port = 0
        self.peer_port = 0
        self.startup_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self.base_dir / "etcd.log"
        self._data_dir = self.base_dir / "data"

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``, the form gocsi's ``X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS`` uses."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        """The etcd process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> EtcdServer:
        """Start etcd and wait until ``/health`` says true; raise :class:`EtcdStartError` if not.

        Retries with new ports if the first ones were taken in the meantime.
        """
        if self._proc is not None:
            raise RuntimeError("etcd is already running")
        last: EtcdStartError | None = None
        for _ in range(3):
            try:
                self._start_once()
                return self
            except EtcdStartError as exc:
                last = exc
                if "address already in use" not in str(exc):
                    raise
        assert last is not None
        raise last

    def _start_once(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self._data_dir, ignore_errors=True)
        self.client_port = _free_port()
        self.peer_port = _free_port()
        while self.peer_port == self.client_port:
            self.peer_port = _free_port()
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        args = [
            # setpriv (util-linux) execs etcd with a parent-death signal, so a test run
            # killed outright does not leave etcd behind. Linux ties it to the starting
            # *thread*: start the server from a thread that lives as long as it should.
            "setpriv",
            "--pdeathsig=KILL",
            "--",
            self.binary,
            "--name=kubevol-test",
            f"--data-dir={self._data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kubevol-test={peer_url}",
            "--initial-cluster-state=new",
            "--heartbeat-interval=20",
            "--election-timeout=200",
            "--logger=zap",
            "--log-outputs=stderr",
            *self.extra_args,
        ]
        started = time.monotonic()
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                raise EtcdStartError(f"etcd exited during start-up:\n{self.log_tail()}")
            if self.healthy():
                self.startup_seconds = time.monotonic() - started
                return
            time.sleep(0.02)
        self.stop()
        raise EtcdStartError(
            f"etcd was not healthy after {self.start_timeout} s:\n{self.log_tail()}"
        )

    def healthy(self) -> bool:
        """True if etcd's ``/health`` endpoint answers ``{"health": "true"}``."""
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=1) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, ValueError):
            return False

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of etcd's log, for error messages."""
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop etcd by PID: SIGTERM, then SIGKILL after ``timeout`` seconds. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._data_dir)
