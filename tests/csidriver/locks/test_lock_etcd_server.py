"""kubevol.testing.etcd.EtcdServer: the real-etcd fixture other tests build on."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubevol.testing.etcd import EtcdServer, EtcdStartError


def test_server_starts_healthy_and_stops_by_pid(tmp_path: Path) -> None:
    """start() returns a healthy etcd on loopback; stop() ends that very process, idempotently."""
    server = EtcdServer(tmp_path).start()
    try:
        pid = server.pid
        assert pid is not None
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "etcd"
        assert server.healthy()
        assert server.endpoint.startswith("127.0.0.1:")
        assert 0 < server.startup_seconds < 30
    finally:
        server.stop()
    server.stop()
    assert server.pid is None
    assert not Path(f"/proc/{pid}").exists() or "etcd" not in Path(f"/proc/{pid}/comm").read_text()
    assert not server.healthy()
    assert not (tmp_path / "data").exists()


def test_two_servers_run_side_by_side(tmp_path: Path) -> None:
    """Each server picks its own free ports, so several can run at once."""
    with EtcdServer(tmp_path / "a") as first, EtcdServer(tmp_path / "b") as second:
        assert first.client_port != second.client_port
        assert first.healthy() and second.healthy()


def test_failed_start_reports_etcd_log(tmp_path: Path) -> None:
    """If etcd exits at start-up, EtcdStartError carries its log."""
    server = EtcdServer(tmp_path, extra_args=["--no-such-flag"])
    with pytest.raises(EtcdStartError, match="no-such-flag"):
        server.start()
    assert server.pid is None


def test_start_twice_is_refused(tmp_path: Path) -> None:
    """A running server cannot be started again."""
    with EtcdServer(tmp_path) as server, pytest.raises(RuntimeError, match="already running"):
        server.start()
    assert server.pid is None
