"""Covers kubevol.nomad.csimanager and kubevol.nomad.instance.

The CSI manager against real plugin processes: fingerprints, health transitions,
registry-driven instances and a deterministic shutdown."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from kubevol.csi import types as t
from kubevol.errors import PluginNotFoundError
from kubevol.nomad import (
    CSIManager,
    CSIVolume,
    HealthState,
    ManagerShutdownError,
    PluginRegistry,
    PluginType,
    RegisteredPlugin,
    RetryPolicy,
    UsageOptions,
    VolumeManager,
)
from kubevol.testing.waiting import wait_until
from kubevol.util.backoff import Backoff
from tests.nomad.conftest import PluginFactory
from tests.nomad.recorder import CallWatch, Recorder

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


@pytest.fixture
def recorder() -> Recorder:
    """Collects the manager's callbacks."""
    return Recorder()


@pytest.fixture
def managers(registry: PluginRegistry, recorder: Recorder) -> Iterator[list[CSIManager]]:
    """Managers made by a test; all are shut down afterwards."""
    made: list[CSIManager] = []
    yield made
    for mgr in made:
        mgr.shutdown()


def start_manager(
    made: list[CSIManager], registry: PluginRegistry, recorder: Recorder, **kwargs: object
) -> CSIManager:
    """A running manager with fast intervals reporting to ``recorder``."""
    options: dict[str, object] = {"fingerprint_interval": 0.1, "resync_period": 60.0}
    options.update(kwargs)
    mgr = CSIManager(
        registry,
        update_node_csi_info=recorder.update,
        trigger_node_event=recorder.event,
        **options,  # type: ignore[arg-type]  # keyword options of CSIManager, checked there
    )
    made.append(mgr)
    mgr.run()
    return mgr


def test_node_fingerprint_reports_info_capabilities_and_staging(
    plugins: PluginFactory,
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
) -> None:
    """A healthy node plugin: node id, volume limit, topology, capabilities, staging."""
    proc = plugins("hostpath")
    registry.register(proc.registration(tmp_path / "root"))
    mgr = start_manager(managers, registry, recorder)
    wait_until(lambda: recorder.health_of("hostpath") is HealthState.HEALTHY)
    info = recorder.last("hostpath")
    assert info is not None and info.healthy and info.plugin_type == "csi-node"
    assert info.node_info is not None and info.controller_info is None
    assert info.node_info.node_id == "node-1"
    assert info.node_info.max_volumes == 7
    assert info.node_info.accessible_topology == t.Topology(segments={"zone": "z1"})
    assert info.node_info.requires_node_stage_volume
    assert info.requires_topologies and not info.requires_controller_plugin
    inst = mgr.instance(PluginType.CSI_NODE, "hostpath")
    assert inst is not None and inst.requires_staging
    # Basic info is asked once; Probe and NodeGetCapabilities on every fingerprint.
    wait_until(lambda: len(proc.calls("Probe")) >= 3)
    assert len(proc.calls("NodeGetInfo")) == 1
    assert len(proc.calls("GetPluginCapabilities")) == 1
    assert recorder.csi_events("hostpath") == ["healthy"]


def test_controller_fingerprint_reports_controller_capabilities(
    plugins: PluginFactory,
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
) -> None:
    """A controller plugin is fingerprinted with ControllerGetCapabilities, not NodeGetInfo."""
    proc = plugins("ctl", "--mode", "controller")
    registry.register(proc.registration(tmp_path / "root", plugin_type=PluginType.CSI_CONTROLLER))
    start_manager(managers, registry, recorder)
    wait_until(lambda: recorder.health_of("ctl") is HealthState.HEALTHY)
    info = recorder.last("ctl")
    assert info is not None and info.controller_info is not None and info.node_info is None
    assert info.controller_info.supports(t.ControllerCapability.PUBLISH_UNPUBLISH_VOLUME)
    assert info.requires_controller_plugin
    assert proc.calls("NodeGetInfo") == []


def test_health_follows_a_killed_and_restarted_plugin(
    plugins: PluginFactory,
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
) -> None:
    """Killing the plugin turns it unhealthy (with a description); restarting it on the same
    socket turns it healthy again; each transition is one CSI node event."""
    proc = plugins("hostpath")
    registry.register(proc.registration(tmp_path / "root"))
    start_manager(managers, registry, recorder)
    wait_until(lambda: recorder.health_of("hostpath") is HealthState.HEALTHY)
    proc.kill()
    wait_until(lambda: recorder.health_of("hostpath") is HealthState.UNHEALTHY)
    last = recorder.last("hostpath")
    assert last is not None and "UNAVAILABLE" in last.health_description
    assert last.node_info is not None and last.node_info.node_id == "node-1"  # cached
    proc.start()
    wait_until(lambda: recorder.health_of("hostpath") is HealthState.HEALTHY)
    assert recorder.csi_events("hostpath") == ["healthy", "unhealthy", "healthy"]


def test_not_ready_plugin_is_unhealthy_but_detected(
    plugins: PluginFactory,
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
) -> None:
    """A plugin answering Probe with ready=false is unhealthy, not undetected."""
    proc = plugins("hostpath", "--not-ready")
    registry.register(proc.registration(tmp_path / "root"))
    start_manager(managers, registry, recorder)
    wait_until(lambda: recorder.health_of("hostpath") is not None)
    last = recorder.last("hostpath")
    assert last is not None and last.health is HealthState.UNHEALTHY
    assert last.health_description == "plugin not ready"


def test_plugin_that_never_answered_is_reported_undetected(
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No process behind the socket: reports say undetected (never healthy or "detected"),
    and so do the final report and the shutdown log."""
    caplog.set_level(logging.INFO, logger="kubevol.nomad.csimanager")
    registry.register(
        RegisteredPlugin(
            type=PluginType.CSI_NODE,
            name="ghost",
            alloc_id="a1",
            socket_path=str(tmp_path / "ghost.sock"),  # nobody listens
            mount_root=str(tmp_path / "root"),
        )
    )
    mgr = start_manager(managers, registry, recorder)
    wait_until(lambda: len(recorder.reports("ghost")) >= 2)
    mgr.shutdown()
    reports = recorder.reports("ghost")
    assert {r.health for r in reports} == {HealthState.UNDETECTED}
    assert "failed initial fingerprint" in reports[0].health_description
    assert recorder.csi_events("ghost") == ["undetected"]
    assert "CSI plugin ghost (csi-node) at shutdown: undetected" in caplog.messages
    with pytest.raises(ManagerShutdownError):
        mgr.mounter_for_plugin("ghost")


def test_registry_events_start_replace_and_stop_instances(
    plugins: PluginFactory,
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
) -> None:
    """Without a resync, registry events alone: a new owner replaces the instance (the old
    one reports a final unhealthy fingerprint first), deregistering the newest falls back
    to the older owner, deregistering the last stops the instance."""
    proc = plugins("hostpath")
    mgr = start_manager(managers, registry, recorder)
    assert mgr.instance(PluginType.CSI_NODE, "hostpath") is None
    registry.register(proc.registration(tmp_path / "root", alloc_id="a1"))
    wait_until(lambda: recorder.health_of("hostpath") is HealthState.HEALTHY)
    registry.register(proc.registration(tmp_path / "root", alloc_id="a2"))
    wait_until(lambda: recorder.reports("hostpath")[-1].alloc_id == "a2")
    allocs = [(r.alloc_id, r.health) for r in recorder.reports("hostpath")]
    first_a2 = allocs.index(("a2", HealthState.HEALTHY))
    assert allocs[first_a2 - 1] == ("a1", HealthState.UNHEALTHY)  # a1's final report
    assert all(a == "a2" for a, _ in allocs[first_a2:])
    registry.deregister(PluginType.CSI_NODE, "hostpath", "a2")
    wait_until(lambda: recorder.reports("hostpath")[-1].alloc_id == "a1")
    registry.deregister(PluginType.CSI_NODE, "hostpath", "a1")
    wait_until(lambda: mgr.instance(PluginType.CSI_NODE, "hostpath") is None)
    last = recorder.last("hostpath")
    assert last is not None and last.alloc_id == "a1" and last.health is HealthState.UNHEALTHY
    assert last.health_description == "plugin instance shut down"


def test_resync_starts_instances_for_plugins_registered_before_run(
    plugins: PluginFactory,
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
) -> None:
    """A restarted agent: plugins in the persisted registry get instances as run() returns."""
    proc = plugins("hostpath")
    registry.register(proc.registration(tmp_path / "root"))
    restarted = PluginRegistry(registry.state_path)
    mgr = start_manager(managers, restarted, recorder)
    assert mgr.instance(PluginType.CSI_NODE, "hostpath") is not None
    assert mgr.wait_for_plugin("hostpath", 1).alloc_id == "plugin-alloc-1"
    mounter = mgr.mounter_for_plugin("hostpath", timeout=10)
    assert mounter.requires_staging
    with pytest.raises(PluginNotFoundError):
        mgr.mounter_for_plugin("absent", timeout=1)


def mount_catching(mounter: VolumeManager, volume: CSIVolume, outcome: list[BaseException]) -> None:
    """Mount ``volume`` for alloc-1, recording what it raised."""
    try:
        mounter.mount_volume(volume, "alloc-1", UsageOptions())
    except BaseException as exc:
        outcome.append(exc)


def test_shutdown_under_load_is_deterministic(
    plugins: PluginFactory,
    registry: PluginRegistry,
    tmp_path: Path,
) -> None:
    """Twenty rounds of: fingerprint three plugins every millisecond while a mount retries
    against a failing NodeStageVolume, then shut down at a random moment. Every round:
    no call starts after shutdown returns, every loop thread has exited, the last report
    of each plugin is its final unhealthy one, and the retrying mount gives up."""
    proc = plugins("busy", "--probe-delay", "0.005", "--fail", "NodeStageVolume=UNAVAILABLE")
    for name in ("busy", "busy-b", "busy-c"):
        reg = proc.registration(tmp_path / name)
        registry.register(attrs.evolve(reg, name=name))
    watch = CallWatch()
    rng = random.Random(9)
    volume = CSIVolume(id="vol", context={"source": str(tmp_path)})
    for _ in range(20):
        watch.reset()
        recorder = Recorder()
        mgr = CSIManager(
            registry,
            update_node_csi_info=recorder.update,
            fingerprint_interval=0.001,
            client_factory=watch.factory,
            retry=RetryPolicy(timeout=60, backoff=Backoff(initial=0.005, maximum=0.02)),
        )
        mgr.run()
        mounter = mgr.mounter_for_plugin("busy", timeout=10)
        outcome: list[BaseException] = []
        mounting = threading.Thread(target=mount_catching, args=(mounter, volume, outcome))
        mounting.start()
        wait_until(lambda: watch.calls > 0)
        threading.Event().wait(rng.uniform(0, 0.05))
        mgr.shutdown()
        watch.shutdown_done()
        mounting.join(5)
        assert not mounting.is_alive(), "the retrying mount did not stop at shutdown"
        assert len(outcome) == 1 and isinstance(outcome[0], ManagerShutdownError)
        leftover = [th.name for th in threading.enumerate() if th.name.startswith("csi-")]
        assert leftover == []
        for name in ("busy", "busy-b", "busy-c"):
            reports = recorder.reports(name)
            assert reports, name
            assert reports[-1].health is not HealthState.HEALTHY
            finals = [r for r in reports if r.health_description == "plugin instance shut down"]
            assert finals == [reports[-1]], "a fingerprint was reported after cancel"
        settled = recorder.count()
        threading.Event().wait(0.02)
        assert recorder.count() == settled, "a report arrived after shutdown returned"
        assert watch.strays == []
    # The driver saw no NodeStageVolume after the last shutdown settled.
    stage_calls = len(proc.calls("NodeStageVolume"))
    threading.Event().wait(0.2)
    assert len(proc.calls("NodeStageVolume")) == stage_calls > 0


def test_registry_events_and_resyncs_trigger_fingerprints(
    plugins: PluginFactory,
    registry: PluginRegistry,
    recorder: Recorder,
    managers: list[CSIManager],
    tmp_path: Path,
) -> None:
    """With a one-minute fingerprint interval, an event about the plugin (an older owner
    leaving) fingerprints the running instance at once, and so does every resync."""
    proc = plugins("hostpath")
    registry.register(proc.registration(tmp_path / "root", alloc_id="old"))
    registry.register(proc.registration(tmp_path / "root", alloc_id="new"))
    start_manager(managers, registry, recorder, fingerprint_interval=60.0)
    wait_until(lambda: recorder.health_of("hostpath") is HealthState.HEALTHY)
    seen = len(recorder.reports("hostpath"))
    registry.deregister(PluginType.CSI_NODE, "hostpath", "old")
    wait_until(lambda: len(recorder.reports("hostpath")) == seen + 1, 5, "an event fingerprint")
    assert recorder.reports("hostpath")[-1].alloc_id == "new"

    start_manager(
        managers,
        PluginRegistry(registry.state_path),
        Recorder(),
        fingerprint_interval=60.0,
        resync_period=0.1,
    )
    probes = len(proc.calls("Probe"))
    wait_until(lambda: len(proc.calls("Probe")) >= probes + 3, 10, "resync fingerprints")
