"""Fixtures for the lock-provider tests: one real etcd server, providers, holder processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.csidriver.locks import EtcdLockProvider
from kubevol.testing.etcd import EtcdServer

HOLDER_SCRIPT = Path(__file__).with_name("lock_holder.py")

ProviderFactory = Callable[..., EtcdLockProvider]
HolderFactory = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A real etcd on loopback, shared by one test module, stopped by PID afterwards."""
    with EtcdServer(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def domain() -> str:
    """A lock domain no other test uses, so tests sharing an etcd never see each other."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_provider(etcd_server: EtcdServer, domain: str) -> Iterator[ProviderFactory]:
    """Build EtcdLockProviders on the shared server and domain; all are closed at teardown."""
    made: list[EtcdLockProvider] = []

    def make(**kwargs: Any) -> EtcdLockProvider:
        kwargs.setdefault("endpoints", [etcd_server.endpoint])
        kwargs.setdefault("domain", domain)
        kwargs.setdefault("ttl", 5)
        provider = EtcdLockProvider(**kwargs)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.close()


@pytest.fixture
def spawn_holder(etcd_server: EtcdServer, domain: str) -> Iterator[HolderFactory]:
    """Start lock_holder.py processes; any still running at teardown are killed by PID."""
    procs: list[subprocess.Popen[str]] = []

    def spawn(mode: str, key: str, ttl: float, *extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HOLDER_SCRIPT),
                mode,
                etcd_server.endpoint,
                domain,
                key,
                str(ttl),
                *extra,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def unused_port() -> int:
    """A loopback TCP port that nothing listens on (bound, then freed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
