"""Covers kubevol.node.agent, as the ``kubevol agent`` process.

The crash test of ``test_crash.py`` run against the real ``kubevol agent`` command: pods
come and go as static-pod manifests, and the agent process is SIGKILLed at random points
and restarted; it must converge with no leaked mount and no lost file. Its readiness is
read from systemd's notify socket, as a service manager would."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.node.test_crash import (
    SEED,
    Driver,
    Pod,
    World,
    create_volumes,
    driver,
    pod_objects,
    pod_uid,
    stop,
)

__all__ = ["driver"]  # the fixture, used by name

PODS = 40
KILLS = 6


class StaticPodWorld(World):
    """Pods are files in the agent's manifest directory; the agent is `kubevol agent`."""

    def __init__(self, tmp: Path, driver: Driver, handles: list[str]) -> None:
        super().__init__(tmp, driver, handles)
        self.manifests = tmp / "manifests"
        self.manifests.mkdir()
        self.notify_path = str(tmp / "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.setblocking(False)
        self.ready = False

    def start_agent(self) -> None:
        self.ready = False
        env = {**os.environ, "NOTIFY_SOCKET": self.notify_path}
        with open(self.tmp / "agent.log", "ab") as out:
            self.agent = subprocess.Popen(
                ["setpriv", "--pdeathsig=KILL", "--", sys.executable, "-m", "kubevol.cli.main",
                 "agent", "--root", str(self.root), "--node-name", "node-1",
                 "--manifests", str(self.manifests), "--metrics-address", "",
                 "--csi-driver", f"hostpath.csi.kubevol.io={self.driver.endpoint}",
                 "--max-backoff", "1s"],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )

    def agent_ready(self) -> bool:
        try:
            while not self.ready:
                self.ready = self.notify.recv(100) == b"READY=1"
        except BlockingIOError:
            pass
        return self.ready

    def add(self, i: int, rng: random.Random) -> None:
        j = rng.randrange(len(self.handles))
        pod = Pod(index=i, uid=pod_uid(i), pv=f"pv{j}", handle=self.handles[j],
                  memory=bool(i % 2))
        tmp = self.manifests / f".p{i}.yaml"
        tmp.write_text("\n---\n".join(json.dumps(o) for o in pod_objects(i, j, pod.handle)))
        os.rename(tmp, self.manifests / f"p{i}.yaml")
        self.running[pod.uid] = pod

    def terminate(self, uid: str) -> None:
        (self.manifests / f"p{self.running[uid].index}.yaml").unlink()
        del self.running[uid]


@pytest.mark.root
def test_kubevol_agent_killed_at_random_points_converges(tmp_path: Path, driver: Driver) -> None:
    """SIGKILL `kubevol agent` at random points while static pods come and go: after each
    restart it converges; no pod seen running loses a mount or a file; at the end, with
    every manifest deleted, nothing of any pod is left and every file is still in its
    CSI volume."""
    rng = random.Random(SEED)
    world = StaticPodWorld(tmp_path, driver, create_volumes(driver, 4))
    world.start_agent()
    try:
        world.churn_with_kills(rng, pods=PODS, kills=KILLS, pause=(0.02, 0.1),
                               kill_within=1.0, converge_every=None, timeout=90)
        assert world.violations == []
        assert len(world.markers) >= PODS // 3, (len(world.markers), world.restarts)

        world.terminate_all_and_check(timeout=90)
        assert world.restarts >= KILLS
    finally:
        stop(world.agent, signal.SIGTERM)
        world.notify.close()
