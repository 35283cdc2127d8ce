"""Covers kubevol.cli.agent, kubevol.node.api_pods and kubevol.cli.status, as processes.

The real ``kubevol agent --kubeconfig`` process against the stand-in API server: the pods
bound to its node come and go, its driver is published in CSINode, and ``kubevol status``
(another process) is answered by it instead of scanning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME, HostPathConfig, HostPathDriver
from kubevol.testing.kube_api import KubeAPIServer
from kubevol.testing.waiting import wait_until

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


def kubevol(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kubevol.cli.main", *argv],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[RunningDriver]:
    (tmp_path / "hp").mkdir()
    running = HostPathDriver(HostPathConfig(state_dir=str(tmp_path / "hp"), node_id="n1")).serve()
    yield running
    running.stop()


def api_pod(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "shop"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}],
                     "volumes": [{"name": "scratch", "emptyDir": {}}]},
            "status": {"phase": "Running"}}


def test_agent_process_with_an_api_server(tmp_path: Path, driver: RunningDriver) -> None:
    """`kubevol agent --kubeconfig K --node-name n1` mounts the node's pods, publishes its
    driver in CSINode, answers `kubevol status` (equal to `status --scan`), and tears down a
    pod the API server deletes; SIGTERM stops it and removes its status socket."""
    if os.geteuid() != 0:
        pytest.fail("the agent needs root")
    root = tmp_path / "root"
    with KubeAPIServer() as api:
        api.add_node("n1")
        kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
        uids = [api.add(api_pod(n))["metadata"]["uid"] for n in ("a", "b")]
        with open(tmp_path / "agent.log", "wb") as log:
            agent = subprocess.Popen(
                ["setpriv", "--pdeathsig=KILL", "--", sys.executable, "-m", "kubevol.cli.main",
                 "agent", "--root", str(root), "--node-name", "n1", "--kubeconfig", kubeconfig,
                 "--metrics-address", "", "--csi-driver", f"{DRIVER_NAME}={driver.endpoint}"],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            def scratch(uid: str) -> Path:
                return root / "pods" / uid / "volumes/kubernetes.io~empty-dir/scratch"

            wait_until(lambda: all(scratch(u).is_dir() for u in uids), 60, "both pods")
            wait_until(lambda: api.get("csinodes", "n1") is not None, 60, "the CSINode")
            assert [d["name"] for d in api.get("csinodes", "n1")["spec"]["drivers"]] == [  # type: ignore[index]
                DRIVER_NAME]

            flags = ["--root", str(root), "--node-name", "n1", "-o", "json", "--no-metrics"]
            wait_until(lambda: "answered by the running agent" in
                     kubevol("status", *flags).stderr, 60, "the agent's answer")
            started = time.monotonic()
            asked = kubevol("status", *flags)
            asked_took = time.monotonic() - started
            started = time.monotonic()
            scanned = kubevol("status", *flags, "--scan")
            scan_took = time.monotonic() - started
            assert asked.returncode == scanned.returncode == 0
            assert "answered by the running agent" in asked.stderr
            assert json.loads(asked.stdout) == json.loads(scanned.stdout)
            assert len(json.loads(asked.stdout)) == 2
            print(f"kubevol status (process): agent {asked_took * 1000:.0f} ms, "
                  f"--scan {scan_took * 1000:.0f} ms")

            api.delete("pods", "a", "shop")
            wait_until(lambda: not (root / "pods" / uids[0]).exists(),
                60, "the deleted pod torn down")
            assert scratch(uids[1]).is_dir()
        finally:
            agent.send_signal(signal.SIGTERM)
            code = agent.wait(60)
        assert code == 0, (tmp_path / "agent.log").read_text()
        assert not (root / "kubevol" / "agent.sock").exists()
        assert scratch(uids[1]).is_dir()  # stopping tears nothing down
        # Stopping does not unpublish the driver either.
        assert api.get("csinodes", "n1")["spec"]["drivers"]  # type: ignore[index]
