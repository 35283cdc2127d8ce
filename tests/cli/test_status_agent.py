"""Covers kubevol.cli.status and kubevol.node.agent_status.

``kubevol status`` asks the agent running on the root instead of scanning it: the answer
equals a scan's, and it comes without a scan; a dead agent's socket means a scan."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.cli.status import agent_rows
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.node import reconstruct
from kubevol.node.agent import Agent
from kubevol.node.agent_status import StatusServer, status_socket_path
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.cli.test_node_cli import run_json
from tests.node.test_agent import UIDS, AgentEnv, env, pod, pv  # noqa: F401


@pytest.fixture
def agent(env: AgentEnv) -> Iterator[Agent]:  # noqa: F811
    """An agent on env's root with two static pods mounted, serving its status as
    ``kubevol agent`` does."""
    handle = env.create_volume("web-data")
    (env.manifests / "web.yaml").write_text(pv("pv-web", handle) + pod("web", """\
  - {name: data, persistentVolumeClaim: {claimName: pv-web-claim}}
  - {name: scratch, emptyDir: {}}
"""))
    (env.manifests / "db.yaml").write_text(pod("db", "  - {name: cache, emptyDir: {}}\n"))
    runtime = NodeRuntime(str(env.root), node_name="n1",
                          csi_drivers={DRIVER_NAME: env.driver.endpoint})
    running = Agent(runtime, manifest_dir=str(env.manifests))
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), daemon=True)
    with StatusServer(str(env.root), lambda: agent_rows(running), ready=running.ready.is_set):
        thread.start()
        try:
            wait_until(lambda: running.running_pods() == sorted(
                [UIDS["web"], UIDS["db"]]), 30, "both pods")
            wait_until(lambda: any(m.endswith("/pv-web/mount") for m in mounts_under(env.root)),
                       30, "the CSI mount")
            yield running
        finally:
            stop.set()
            thread.join(30)
            running.close()
            runtime.close()


@pytest.mark.root
def test_status_answers_from_the_agent_as_a_scan_would(
    env: AgentEnv, agent: Agent, capsys: pytest.CaptureFixture[str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With an agent on the root, `status -o json` is the agent's answer (no scan: the scan
    is made to fail) and equals `status --scan`'s, row for row."""
    flags = ["--root", str(env.root), "--node-name", "n1", "-o", "json", "--no-metrics"]
    started = time.monotonic()
    code, scanned = run_json(capsys, "status", *flags, "--scan")
    scan_took = time.monotonic() - started
    assert code == 0 and isinstance(scanned, list) and len(scanned) == 3

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("status scanned although the agent answers")

    monkeypatch.setattr(reconstruct, "scan", no_scan)
    monkeypatch.setattr("kubevol.cli.status.scan", no_scan)
    started = time.monotonic()
    assert main(["status", *flags]) == 0
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert "answered by the running agent" in err
    answered = json.loads(out)
    assert answered == scanned
    assert {r["state"] for r in answered} == {"mounted", "present"}
    assert {r["desired"] for r in answered} == {"running"}
    print(f"status in-process: from the agent {took * 1000:.0f} ms, --scan "
          f"{scan_took * 1000:.0f} ms")


def test_a_dead_agents_socket_means_a_scan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A status socket nobody listens on (an agent killed) is ignored: status scans."""
    root = tmp_path / "root"
    path = status_socket_path(str(root))
    os.makedirs(os.path.dirname(path))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)  # bound, never listening: connections are refused
    assert main(["status", "--root", str(root), "--node-name", "n1", "-o", "json",
                 "--no-metrics"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == []
    assert "answered by the running agent" not in err
