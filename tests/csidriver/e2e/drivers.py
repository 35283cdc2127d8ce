"""The bundled hostpath driver with one node behaviour broken on purpose, served in the test
process (so it shares the test's mount namespace), for the e2e suite's own tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import attrs

from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csidriver.drivers.common import RunningDriver, serve_plugin
from kubevol.csidriver.drivers.engine import (
    DriverState,
    Engine,
    EngineController,
    EngineNode,
    Publication,
    Staging,
    VolumeRecord,
    build_storage_plugin,
)
from kubevol.csidriver.drivers.engine.rpc import absolute_path, capability
from kubevol.csidriver.drivers.hostpath import HostPathConfig
from kubevol.csidriver.drivers.hostpath.backend import HostPathBackend
from kubevol.csidriver.drivers.hostpath.state import SqliteStore
from kubevol.csidriver.server import StoragePlugin
from kubevol.csidriver.server.services import Context, Message
from kubevol.testing.e2e import E2EConfig, Outcome, Status, run_checks

MiB = 1 << 20
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"
#: The CSIDriver object of a driver that makes inline ephemeral volumes.
EPHEMERAL_CSIDRIVER: Mapping[str, object] = {
    "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
    "metadata": {"name": "hostpath.csi.kubevol.io"},
    "spec": {"attachRequired": False, "fsGroupPolicy": "File", "podInfoOnMount": True,
             "volumeLifecycleModes": ["Persistent", "Ephemeral"]},
}


class EphemeralNode(EngineNode):
    """The hostpath node service that also serves CSI inline ephemeral volumes, as the
    upstream hostpath driver does: a NodePublishVolume marked ephemeral makes a volume named
    after the handle (:meth:`volume_name`) and publishes it unstaged; the NodeUnpublishVolume
    of its last target deletes it."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.controller = EngineController(engine)
        backend = engine.backend
        assert isinstance(backend, HostPathBackend)
        self.state_dir = backend.root

    def volume_name(self, request: Message) -> str:
        """The name of the volume an ephemeral publish makes: its handle."""
        return str(request.volume_id)

    def _named(self, name: str) -> VolumeRecord | None:
        return next((v for v in self.engine.volumes() if v.name == name), None)

    def node_publish_volume(self, request: Message, context: Context) -> Message:
        if request.volume_context.get(EPHEMERAL_KEY) != "true":
            return super().node_publish_volume(request, context)
        target = absolute_path(request.target_path, "target_path")
        cap = capability(request)
        name = self.volume_name(request)
        created = self.controller.create_volume(csi_pb2.CreateVolumeRequest(
            name=name, volume_capabilities=[request.volume_capability],
            capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB)), context)
        volume_id = created.volume.volume_id
        with self.engine.locks.hold(volume_id):
            vol = self.engine.volume(volume_id)
            assert vol is not None
            if target in vol.publications:
                return csi_pb2.NodePublishVolumeResponse()
            staging = vol.staging
            if staging is None:  # its own staging, where the kubelet gives none
                path = os.path.join(self.state_dir, "inline-staging", volume_id)
                os.makedirs(path, exist_ok=True)
                staging = self.engine.backend.stage(
                    vol, Staging(path=path, capability=cap), repeat=False)
                vol = attrs.evolve(vol, staging=staging)
                self.engine.put_volume(vol)
            pub = Publication(target_path=target, staging_path=staging.path,
                              readonly=request.readonly, capability=cap)
            self.engine.backend.publish(vol, pub, staging, repeat=False)
            self.engine.put_volume(
                attrs.evolve(vol, publications={**vol.publications, target: pub}))
        return csi_pb2.NodePublishVolumeResponse()

    def node_unpublish_volume(self, request: Message, context: Context) -> Message:
        if self.engine.volume(request.volume_id) is not None:
            return super().node_unpublish_volume(request, context)
        target = absolute_path(request.target_path, "target_path")
        vol = next((v for v in self.engine.volumes() if target in v.publications), None)
        if vol is None:
            return csi_pb2.NodeUnpublishVolumeResponse()
        with self.engine.locks.hold(vol.volume_id):
            self.engine.backend.unpublish(vol, vol.publications[target])
            remaining = {k: v for k, v in vol.publications.items() if k != target}
            vol = attrs.evolve(vol, publications=remaining)
            if not remaining and vol.staging is not None:
                self.engine.backend.unstage(vol, vol.staging)
                vol = attrs.evolve(vol, staging=None)
            self.engine.put_volume(vol)
        if not remaining:
            self.controller.delete_volume(
                csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id), context)
        return csi_pb2.NodeUnpublishVolumeResponse()


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
    node_caps: frozenset[t.NodeCapability] = frozenset()
    max_volumes: int = 0
    wrap: Callable[[StoragePlugin], StoragePlugin] | None = None
    running: RunningDriver | None = None

    def start(self) -> None:
        config = HostPathConfig(state_dir=self.state_dir, node_id="n1")
        store = ForgetfulStore(self.state_dir) if self.forgets else SqliteStore(self.state_dir)
        settings = config.settings()
        settings = attrs.evolve(settings, node_caps=settings.node_caps | self.node_caps,
                                max_volumes_per_node=self.max_volumes)
        engine = Engine(settings, self.backend(self.state_dir), store)
        plugin = build_storage_plugin(engine)
        broken = StoragePlugin(identity=plugin.identity, controller=plugin.controller,
                               node=self.node(engine), group_controller=plugin.group_controller)
        if self.wrap is not None:
            broken = self.wrap(broken)
        self.running = serve_plugin(broken, self.endpoint, cleanup=store.close)

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop(grace=1)
            self.running = None

    def restart(self) -> None:
        self.stop()
        self.start()


def hostpath(tmp: Path, *, backend: type[HostPathBackend] = HostPathBackend,
             node: type[EngineNode] = EngineNode, forgets: bool = False,
             node_caps: frozenset[t.NodeCapability] = frozenset(), max_volumes: int = 0,
             wrap: Callable[[StoragePlugin], StoragePlugin] | None = None,
             ) -> Iterator[Driver]:
    """Serve a (perhaps broken) hostpath driver on a tmpfs of its own, advertising
    ``node_caps`` too and a volume limit of ``max_volumes``, its services passed through
    ``wrap``; stop it after."""
    state = tmp / "hp"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(state)],
                   check=True)
    driver = Driver(state_dir=str(state), endpoint=f"unix://{tmp}/csi.sock", backend=backend,
                    node=node, forgets=forgets, node_caps=node_caps,
                    max_volumes=max_volumes, wrap=wrap)
    driver.start()
    try:
        yield driver
    finally:
        driver.stop()
        subprocess.run(["umount", "-R", "-l", str(state)], check=False)
        shutil.rmtree(state, ignore_errors=True)


def run(driver: Driver, tmp: Path, select: str, *, restart: bool = False,
        csidriver: Mapping[str, object] | None = None) -> dict[str, Outcome]:
    """Run the checks ``select`` picks against ``driver`` (whose CSIDriver object is
    ``csidriver``); outcomes by check name."""
    work = tmp / "e2e"
    os.makedirs(work, exist_ok=True)
    config = E2EConfig(endpoint=driver.endpoint, volume_size=16 * MiB, select=select,
                       timeout=8.0, work_dir=str(work), csidriver=csidriver)
    with open(tmp / "report.txt", "w", encoding="utf-8") as out:
        outcomes = run_checks(config, out=out, restart=driver.restart if restart else None)
    return {o.name: o for o in outcomes}


def failed(outcomes: dict[str, Outcome]) -> set[str]:
    """The names of the checks that failed."""
    return {name for name, o in outcomes.items() if o.status is Status.FAILED}
