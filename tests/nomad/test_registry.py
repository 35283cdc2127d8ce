"""Covers kubevol.nomad.registry.

The dynamic plugin registry: instances, ordered lossless events, waiting, persistence.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from kubevol.errors import InvalidPathSegmentError, PluginNotFoundError
from kubevol.nomad import (
    ManagerStateError,
    PluginRegistry,
    PluginType,
    PluginWaitTimeoutError,
    RegisteredPlugin,
    RegistryEventType,
)
from kubevol.util.backoff import Backoff

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

NODE = PluginType.CSI_NODE
CONTROLLER = PluginType.CSI_CONTROLLER


def entry(
    name: str = "hostpath", alloc: str = "a1", ptype: PluginType = NODE, sock: str = ""
) -> RegisteredPlugin:
    """A registration with paths derived from the names."""
    return RegisteredPlugin(
        type=ptype,
        name=name,
        alloc_id=alloc,
        socket_path=sock or f"/run/csi/{name}-{alloc}.sock",
        mount_root=f"/var/lib/agent/csi/{ptype.value}/{name}",
    )


def test_newest_instance_is_dispensed_and_listed() -> None:
    """Several owners of one plugin: the newest registration is dispensed and listed."""
    reg = PluginRegistry()
    reg.register(entry(alloc="a1"))
    reg.register(entry(alloc="a2"))
    assert reg.dispense(NODE, "hostpath").alloc_id == "a2"
    assert [p.alloc_id for p in reg.instances(NODE, "hostpath")] == ["a2", "a1"]
    assert reg.list_plugins(NODE)["hostpath"].alloc_id == "a2"
    assert reg.list_plugins(CONTROLLER) == {}
    reg.deregister(NODE, "hostpath", "a2")
    assert reg.dispense(NODE, "hostpath").alloc_id == "a1"


def test_dispense_unknown_plugin_raises_lookup_error() -> None:
    """Dispensing a plugin nobody registered raises PluginNotFoundError (a LookupError)."""
    reg = PluginRegistry()
    reg.register(entry(ptype=CONTROLLER))
    with pytest.raises(LookupError, match="csi-node plugin 'hostpath'"):
        reg.dispense(NODE, "hostpath")
    assert issubclass(PluginNotFoundError, LookupError)


def test_events_are_ordered_and_describe_each_change() -> None:
    """Register/deregister produce events in call order with growing sequence numbers."""
    reg = PluginRegistry()
    sub = reg.subscribe()
    reg.register(entry(alloc="a1"))
    reg.register(entry(alloc="a2"))
    reg.register(entry(name="ctl", ptype=CONTROLLER))
    assert reg.deregister(NODE, "hostpath", "a1") is not None
    reg.deregister(NODE, "hostpath", "a2")
    got = [sub.get(timeout=1) for _ in range(5)]
    assert [(e.type, e.plugin.name, e.plugin.alloc_id) for e in got if e] == [
        (RegistryEventType.REGISTERED, "hostpath", "a1"),
        (RegistryEventType.REGISTERED, "hostpath", "a2"),
        (RegistryEventType.REGISTERED, "ctl", "a1"),
        (RegistryEventType.DEREGISTERED, "hostpath", "a1"),
        (RegistryEventType.DEREGISTERED, "hostpath", "a2"),
    ]
    assert [e.seq for e in got if e] == sorted(e.seq for e in got if e)
    assert sub.get(timeout=0.01) is None


def test_type_filtered_subscription_sees_only_its_type() -> None:
    """A subscription for csi-controller events ignores csi-node changes."""
    reg = PluginRegistry()
    sub = reg.subscribe(CONTROLLER)
    reg.register(entry())
    reg.register(entry(name="ctl", ptype=CONTROLLER))
    event = sub.get(timeout=1)
    assert event is not None and event.plugin.name == "ctl"
    assert sub.pending() == 0


def test_reregistering_unchanged_is_silent_and_a_change_is_an_event() -> None:
    """Same details again: no event; the same owner with a new socket: replaced + event."""
    reg = PluginRegistry()
    sub = reg.subscribe()
    assert reg.register(entry()) is True
    assert reg.register(entry()) is False
    moved = entry(sock="/run/csi/new.sock")
    assert reg.register(moved) is True
    assert reg.instances(NODE, "hostpath") == (moved,)
    assert sub.pending() == 2


def test_deregister_of_unknown_owner_is_a_silent_no_op() -> None:
    """Deregistering an owner that holds no instance returns None and broadcasts nothing
    (Nomad broadcasts the last element then; that quirk is not kept)."""
    reg = PluginRegistry()
    reg.register(entry(alloc="a1"))
    sub = reg.subscribe()
    assert reg.deregister(NODE, "hostpath", "nobody") is None
    assert reg.deregister(NODE, "absent", "a1") is None
    assert sub.pending() == 0
    assert reg.dispense(NODE, "hostpath").alloc_id == "a1"


def test_no_event_is_dropped_under_concurrent_changes() -> None:
    """Eight threads making 100 changes each: every subscriber gets all 800, in seq order."""
    reg = PluginRegistry()
    subs = [reg.subscribe() for _ in range(3)]

    def churn(n: int) -> None:
        for i in range(50):
            reg.register(entry(name=f"p{n}", alloc=f"a{i}"))
            reg.deregister(NODE, f"p{n}", f"a{i}")

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for sub in subs:
        seqs = []
        while (event := sub.get(timeout=0)) is not None:
            seqs.append(event.seq)
        assert seqs == list(range(1, 801))


def test_closed_subscription_ends_iteration_and_stops_receiving() -> None:
    """After close(), iteration drains the queue and stops; later events are not queued."""
    reg = PluginRegistry()
    sub = reg.subscribe()
    reg.register(entry(alloc="a1"))
    sub.close()
    reg.register(entry(alloc="a2"))
    assert [e.plugin.alloc_id for e in sub] == ["a1"]
    assert sub.closed


def test_wait_for_plugin_returns_when_registered_later() -> None:
    """wait_for_plugin wakes when another thread registers the plugin."""
    reg = PluginRegistry()
    timer = threading.Timer(0.3, lambda: reg.register(entry(alloc="late")))
    timer.start()
    start = time.monotonic()
    found = reg.wait_for_plugin("hostpath", timeout=10)
    timer.join()
    assert found.alloc_id == "late"
    assert time.monotonic() - start < 5


def test_wait_for_plugin_times_out_with_a_timeout_error() -> None:
    """A plugin never registered: PluginWaitTimeoutError (TimeoutError and LookupError)."""
    reg = PluginRegistry(wait_backoff=Backoff(initial=0.01, maximum=0.05))
    with pytest.raises(PluginWaitTimeoutError, match=r"not registered within 0\.2s") as info:
        reg.wait_for_plugin("hostpath", timeout=0.2)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, LookupError)


def test_wait_for_plugin_of_another_type_and_cancelled() -> None:
    """plugin_type selects controller plugins; a set cancel event ends the wait early."""
    reg = PluginRegistry()
    reg.register(entry(name="ctl", ptype=CONTROLLER))
    assert reg.wait_for_plugin("ctl", 1, plugin_type=CONTROLLER).name == "ctl"
    cancel = threading.Event()
    cancel.set()
    start = time.monotonic()
    with pytest.raises(PluginWaitTimeoutError):
        reg.wait_for_plugin("ctl", 30, cancel=cancel)  # a node plugin "ctl" never comes
    assert time.monotonic() - start < 1


def test_wait_backoff_grows_from_200ms_to_5s() -> None:
    """The default wait backoff is Nomad's: 200 ms doubling, capped at 5 s."""
    from kubevol.nomad import WAIT_BACKOFF

    assert [WAIT_BACKOFF.delay(i) for i in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert WAIT_BACKOFF.delay(10_000) == 5.0


def test_state_survives_a_restart(tmp_path: Path) -> None:
    """A new registry on the same state file finds the same instances in the same order."""
    path = str(tmp_path / "state" / "registry.json")
    reg = PluginRegistry(path)
    reg.register(entry(alloc="a1"))
    reg.register(entry(alloc="a2"))
    reg.register(entry(name="ctl", ptype=CONTROLLER))
    reg.deregister(CONTROLLER, "ctl", "a1")
    again = PluginRegistry(path)
    assert again.instances(NODE, "hostpath") == reg.instances(NODE, "hostpath")
    assert again.list_plugins(CONTROLLER) == {}
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path / "state") == ["registry.json"]  # no temp file left


def test_unreadable_state_is_refused_with_the_path(tmp_path: Path) -> None:
    """Garbage or foreign JSON in the state file raises ManagerStateError naming it."""
    path = tmp_path / "registry.json"
    path.write_text("{not json")
    with pytest.raises(ManagerStateError, match=r"registry\.json"):
        PluginRegistry(str(path))
    path.write_text(json.dumps({"kind": "something-else", "version": 1, "data": {}}))
    with pytest.raises(ManagerStateError, match="does not hold"):
        PluginRegistry(str(path))


def test_failed_persist_leaves_registry_unchanged(tmp_path: Path) -> None:
    """When the state cannot be written, register raises and neither memory nor the
    subscribers see the change."""
    reg = PluginRegistry(str(tmp_path / "state" / "registry.json"))
    (tmp_path / "state").write_text("")  # its directory is now a file: writes fail
    sub = reg.subscribe()
    with pytest.raises(ManagerStateError):
        reg.register(entry())
    assert reg.instances(NODE, "hostpath") == ()
    assert sub.pending() == 0


@pytest.mark.parametrize("bad", ["..", "a/b", "", "x\0y", "n" * 256])
def test_names_that_would_escape_the_mount_root_are_refused(bad: str) -> None:
    """Plugin names and owner ids become path segments: traversal is refused."""
    with pytest.raises(InvalidPathSegmentError):
        entry(name=bad)
    with pytest.raises(InvalidPathSegmentError):
        entry(alloc=bad)


def test_relative_socket_path_is_refused() -> None:
    """Socket and mount root paths must be absolute."""
    with pytest.raises(InvalidPathSegmentError, match="socket path"):
        RegisteredPlugin(
            type=NODE, name="x", alloc_id="a", socket_path="x.sock", mount_root="/var/x"
        )
