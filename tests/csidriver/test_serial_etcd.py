"""Covers kubevol.csidriver.server.middleware.serialvolume with kubevol.csidriver.locks.etcd.

Serial volume access across driver PROCESSES through a real etcd started by the test.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.testing.etcd import EtcdServer
from tests.csi.support import ProcessFactory, wait_for_file

CAP = t.VolumeCapability.mount()
TTL_SECONDS = 2


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd on loopback for this module, stopped by PID afterwards."""
    with EtcdServer(tmp_path_factory.mktemp("etcd")) as server:
        yield server


def _env(etcd: EtcdServer, domain: str) -> dict[str, str]:
    return {
        "X_CSI_SERIAL_VOL_ACCESS": "true",
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS": etcd.endpoint,
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_DOMAIN": domain,
        "X_CSI_SERIAL_VOL_ACCESS_ETCD_TTL": f"{TTL_SECONDS}s",
    }


def _aborted(call: Callable[[], object]) -> bool:
    """Run ``call``; True if it was ABORTED, False if it succeeded, raise otherwise."""
    try:
        call()
    except CSIRPCError as exc:
        if exc.code is grpc.StatusCode.ABORTED:
            return True
        raise
    return False


def test_two_driver_processes_serialise_on_one_volume(
    etcd: EtcdServer, driver_process: ProcessFactory, tmp_path: Path
) -> None:
    """While process A publishes v1, process B's call on v1 is ABORTED; v2 goes through."""
    domain = f"test-{uuid.uuid4().hex[:8]}"
    entered = tmp_path / "entered"
    entered.mkdir()
    sock_a, sock_b = tmp_path / "a.sock", tmp_path / "b.sock"
    driver_process(
        sock_a,
        _env(etcd, domain),
        "--sleep", "NodePublishVolume=2.0", "--entered-dir", str(entered),
    )
    driver_process(sock_b, _env(etcd, domain))
    results: list[str] = []
    with CSIClient(str(sock_a)) as a, CSIClient(str(sock_b)) as b:

        def publish_on_a() -> None:
            a.node_publish_volume("v1", str(tmp_path / "ta"), CAP)
            results.append("ok")

        thread = threading.Thread(target=publish_on_a)
        thread.start()
        wait_for_file(entered / "NodePublishVolume")
        assert _aborted(lambda: b.node_publish_volume("v1", str(tmp_path / "tb"), CAP))
        assert _aborted(lambda: b.node_unstage_volume("v1", str(tmp_path)))
        b.node_publish_volume("v2", str(tmp_path / "tc"), CAP)
        thread.join(15)
        assert results == ["ok"]
        b.node_publish_volume("v1", str(tmp_path / "tb"), CAP)


def test_killed_holders_lock_expires_with_its_lease(
    etcd: EtcdServer, driver_process: ProcessFactory, tmp_path: Path
) -> None:
    """A holder killed mid-call keeps v1 locked only until its lease's TTL runs out."""
    domain = f"test-{uuid.uuid4().hex[:8]}"
    entered = tmp_path / "entered"
    entered.mkdir()
    sock_a, sock_b = tmp_path / "a.sock", tmp_path / "b.sock"
    holder = driver_process(
        sock_a,
        _env(etcd, domain),
        "--sleep", "NodePublishVolume=60", "--entered-dir", str(entered),
    )
    driver_process(sock_b, _env(etcd, domain))
    a = CSIClient(str(sock_a), timeout=5)
    try:
        failures: list[grpc.StatusCode] = []

        def publish_on_a() -> None:
            try:
                a.node_publish_volume("v1", str(tmp_path / "ta"), CAP)
            except CSIRPCError as exc:  # the holder dies mid-call
                failures.append(exc.code)

        thread = threading.Thread(target=publish_on_a)
        thread.start()
        wait_for_file(entered / "NodePublishVolume")
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        killed_at = time.monotonic()
        with CSIClient(str(sock_b)) as b:
            assert _aborted(lambda: b.node_publish_volume("v1", str(tmp_path / "tb"), CAP))
            deadline = killed_at + TTL_SECONDS + 10
            while _aborted(lambda: b.node_publish_volume("v1", str(tmp_path / "tb"), CAP)):
                assert time.monotonic() < deadline, "the dead holder's lock never expired"
                time.sleep(0.2)
        assert time.monotonic() - killed_at >= TTL_SECONDS * 0.5
        thread.join(10)
        assert failures == [grpc.StatusCode.UNAVAILABLE]
    finally:
        a.close()
