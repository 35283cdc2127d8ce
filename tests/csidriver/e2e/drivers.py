"""The bundled hostpath driver with one node behaviour broken on purpose, served in the test
process (so it shares the test's mount namespace), for the e2e suite's own tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs

from kubevol.csidriver.drivers.common import RunningDriver, serve_plugin
from kubevol.csidriver.drivers.engine import (
    DriverState,
    Engine,
    EngineNode,
    build_storage_plugin,
)
from kubevol.csidriver.drivers.hostpath import HostPathConfig
from kubevol.csidriver.drivers.hostpath.backend import HostPathBackend
from kubevol.csidriver.drivers.hostpath.state import SqliteStore
from kubevol.csidriver.server import StoragePlugin
from kubevol.testing.e2e import E2EConfig, Outcome, Status, run_checks

MiB = 1 << 20


class ForgetfulStore(SqliteStore):
    """Keeps the volumes but, on every load, forgets where they are staged and published."""

    def load(self) -> DriverState:
        state = super().load()
        for key, volume in list(state.volumes.items()):
            state.volumes[key] = attrs.evolve(volume, staging=None, publications={})
        return state


@attrs.define
class Driver:
    """A hostpath-based driver on ``endpoint`` that :meth:`restart` serves again on the
    same socket; with ``forgets``, a restart loses its node state (what is staged and
    published where), as a driver that keeps it in memory only."""

    state_dir: str
    endpoint: str
    backend: type[HostPathBackend] = HostPathBackend
    node: type[EngineNode] = EngineNode
    forgets: bool = False
    running: RunningDriver | None = None

    def start(self) -> None:
        config = HostPathConfig(state_dir=self.state_dir, node_id="n1")
        store = ForgetfulStore(self.state_dir) if self.forgets else SqliteStore(self.state_dir)
        engine = Engine(config.settings(), self.backend(self.state_dir), store)
        plugin = build_storage_plugin(engine)
        broken = StoragePlugin(identity=plugin.identity, controller=plugin.controller,
                               node=self.node(engine), group_controller=plugin.group_controller)
        self.running = serve_plugin(broken, self.endpoint, cleanup=store.close)

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop(grace=1)
            self.running = None

    def restart(self) -> None:
        self.stop()
        self.start()


def hostpath(tmp: Path, *, backend: type[HostPathBackend] = HostPathBackend,
             node: type[EngineNode] = EngineNode, forgets: bool = False) -> Iterator[Driver]:
    """Serve a (perhaps broken) hostpath driver on a tmpfs of its own; stop it after."""
    state = tmp / "hp"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(state)],
                   check=True)
    driver = Driver(state_dir=str(state), endpoint=f"unix://{tmp}/csi.sock", backend=backend,
                    node=node, forgets=forgets)
    driver.start()
    try:
        yield driver
    finally:
        driver.stop()
        subprocess.run(["umount", "-R", "-l", str(state)], check=False)
        shutil.rmtree(state, ignore_errors=True)


def run(driver: Driver, tmp: Path, select: str, *, restart: bool = False) -> dict[str, Outcome]:
    """Run the checks ``select`` picks against ``driver``; outcomes by check name."""
    work = tmp / "e2e"
    os.makedirs(work, exist_ok=True)
    config = E2EConfig(endpoint=driver.endpoint, volume_size=16 * MiB, select=select,
                       timeout=8.0, work_dir=str(work))
    with open(tmp / "report.txt", "w", encoding="utf-8") as out:
        outcomes = run_checks(config, out=out, restart=driver.restart if restart else None)
    return {o.name: o for o in outcomes}


def failed(outcomes: dict[str, Outcome]) -> set[str]:
    """The names of the checks that failed."""
    return {name for name, o in outcomes.items() if o.status is Status.FAILED}
