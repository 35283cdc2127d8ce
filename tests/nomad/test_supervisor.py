"""Covers kubevol.nomad.supervisor.

The plugin supervisor against real plugin processes: preparing the mount root, waiting
for the socket, the health timeout, registration order and heartbeat events."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubevol.nomad import (
    CSIManager,
    HealthState,
    PluginRegistry,
    PluginSupervisor,
    PluginTaskConfig,
    PluginType,
    PluginUnhealthyError,
    RegistryEventType,
    TaskEvent,
    TaskEventType,
)
from kubevol.testing.waiting import wait_until
from tests.nomad.conftest import PluginFactory, PluginProcess
from tests.nomad.recorder import Recorder

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


class Events:
    """Collects task events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[TaskEvent] = []

    def __call__(self, event: TaskEvent) -> None:
        with self._lock:
            self.items.append(event)

    def types(self) -> list[TaskEventType]:
        """The event types so far."""
        with self._lock:
            return [e.type for e in self.items]


@pytest.fixture
def supervisors() -> Iterator[list[PluginSupervisor]]:
    """Supervisors made by a test, stopped afterwards."""
    made: list[PluginSupervisor] = []
    yield made
    for sup in made:
        sup.stop()


def supervise(
    made: list[PluginSupervisor],
    proc: PluginProcess,
    registry: PluginRegistry,
    tmp_path: Path,
    *,
    events: Events | None = None,
    on_health_timeout: Callable[[PluginUnhealthyError], None] | None = None,
    **kwargs: object,
) -> PluginSupervisor:
    """A supervisor for ``proc`` with fast intervals."""
    options: dict[str, object] = {
        "probe_interval": 0.05,
        "heartbeat_interval": 0.1,
        "health_timeout": 10.0,
        "probe_timeout": 2.0,
    }
    options.update(kwargs)
    config = PluginTaskConfig(
        plugin_id=proc.name,
        plugin_type=PluginType.CSI_NODE,
        alloc_id=f"alloc-{proc.name}",
        mount_root=str(tmp_path / "csi" / "csi-node" / proc.name),
        socket_path=proc.socket_path,
        **options,  # type: ignore[arg-type]  # interval options, validated by attrs
    )
    sup = PluginSupervisor(config, registry, on_event=events, on_health_timeout=on_health_timeout)
    made.append(sup)
    return sup


def test_supervised_plugins_register_and_deregister_in_order(
    plugins: PluginFactory,
    registry: PluginRegistry,
    supervisors: list[PluginSupervisor],
    tmp_path: Path,
) -> None:
    """Two plugin tasks come and go: the registry's events follow exactly, and a manager
    following the registry starts and stops their instances."""
    sub = registry.subscribe()
    recorder = Recorder()
    mgr = CSIManager(registry, update_node_csi_info=recorder.update, fingerprint_interval=0.1)
    mgr.run()
    try:
        first = supervise(supervisors, plugins("first"), registry, tmp_path)
        second = supervise(supervisors, plugins("second"), registry, tmp_path)
        first.start()
        assert first.wait_registered(10)
        second.start()
        assert second.wait_registered(10)
        wait_until(lambda: recorder.health_of("second") is HealthState.HEALTHY)
        first.stop()
        second.stop()
        events = [sub.get(timeout=1) for _ in range(4)]
        assert [(e.type, e.plugin.name) for e in events if e] == [
            (RegistryEventType.REGISTERED, "first"),
            (RegistryEventType.REGISTERED, "second"),
            (RegistryEventType.DEREGISTERED, "first"),
            (RegistryEventType.DEREGISTERED, "second"),
        ]
        assert sub.get(timeout=0.1) is None
        wait_until(lambda: mgr.instance(PluginType.CSI_NODE, "second") is None)
        assert mgr.instance(PluginType.CSI_NODE, "first") is None
        last = recorder.last("first")
        assert last is not None and last.health is HealthState.UNHEALTHY
        assert registry.list_plugins(PluginType.CSI_NODE) == {}
    finally:
        mgr.shutdown()


def test_prepare_creates_the_mount_root_layout(
    plugins: PluginFactory,
    registry: PluginRegistry,
    supervisors: list[PluginSupervisor],
    tmp_path: Path,
) -> None:
    """prepare() makes <root>, <root>/staging and <root>/per-alloc, private to root."""
    sup = supervise(supervisors, plugins("prep", start=False), registry, tmp_path)
    sup.prepare()
    root = tmp_path / "csi" / "csi-node" / "prep"
    assert sorted(p.name for p in root.iterdir()) == ["per-alloc", "staging"]
    assert root.stat().st_mode & 0o777 == 0o700


def test_supervisor_waits_for_a_socket_that_appears_late(
    plugins: PluginFactory,
    registry: PluginRegistry,
    supervisors: list[PluginSupervisor],
    tmp_path: Path,
) -> None:
    """Started before its plugin listens, the supervisor registers once the socket answers."""
    proc = plugins("late", start=False)
    events = Events()
    sup = supervise(supervisors, proc, registry, tmp_path, events=events)
    sup.start()
    assert not sup.wait_registered(0.3)
    proc.start()
    assert sup.wait_registered(10)
    assert registry.dispense(PluginType.CSI_NODE, "late").alloc_id == "alloc-late"
    assert events.types() == [TaskEventType.PLUGIN_HEALTHY]


def test_plugin_never_healthy_hits_the_health_timeout(
    plugins: PluginFactory,
    registry: PluginRegistry,
    supervisors: list[PluginSupervisor],
    tmp_path: Path,
) -> None:
    """A plugin answering not-ready: after health_timeout the failure callback gets a
    PluginUnhealthyError, an unhealthy event is emitted and nothing is registered."""
    proc = plugins("sick", "--not-ready")
    events = Events()
    failures: list[PluginUnhealthyError] = []
    sup = supervise(
        supervisors,
        proc,
        registry,
        tmp_path,
        events=events,
        on_health_timeout=failures.append,
        health_timeout=0.4,
    )
    sup.start()
    wait_until(lambda: failures, what="the health timeout")
    assert "did not become healthy within 0.4s (answered not ready)" in str(failures[0])
    assert events.types() == [TaskEventType.PLUGIN_UNHEALTHY]
    assert not sup.registered
    assert registry.list_plugins(PluginType.CSI_NODE) == {}
    assert len(proc.calls("Probe")) >= 3  # probed on the interval, not once


def test_heartbeat_reports_a_killed_and_restarted_plugin(
    plugins: PluginFactory,
    registry: PluginRegistry,
    supervisors: list[PluginSupervisor],
    tmp_path: Path,
) -> None:
    """After registration the heartbeat emits unhealthy when the plugin dies and healthy
    when it is back; the plugin stays registered meanwhile."""
    proc = plugins("beat")
    events = Events()
    sup = supervise(supervisors, proc, registry, tmp_path, events=events)
    sup.start()
    assert sup.wait_registered(10)
    proc.kill()
    wait_until(lambda: sup.healthy is False)
    assert registry.dispense(PluginType.CSI_NODE, "beat").alloc_id == "alloc-beat"
    proc.start()
    wait_until(lambda: len(events.types()) == 3)
    assert events.types() == [
        TaskEventType.PLUGIN_HEALTHY,
        TaskEventType.PLUGIN_UNHEALTHY,
        TaskEventType.PLUGIN_HEALTHY,
    ]
    sup.stop()
    assert registry.list_plugins(PluginType.CSI_NODE) == {}
