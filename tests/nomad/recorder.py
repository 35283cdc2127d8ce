"""Test helpers: a recorder for the manager's callbacks and a client that notices calls
started after a shutdown returned."""

from __future__ import annotations

import threading
from typing import Any

from kubevol.csi.client import CSIClient
from kubevol.nomad import CSIInfo, HealthState, NodeEvent


class Recorder:
    """Collects ``update_node_csi_info`` reports and node events, thread-safely."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.infos: list[tuple[str, CSIInfo]] = []
        self.events: list[NodeEvent] = []

    def update(self, name: str, info: CSIInfo) -> None:
        """The UpdateNodeCSIInfoFunc."""
        with self._lock:
            self.infos.append((name, info))

    def event(self, event: NodeEvent) -> None:
        """The TriggerNodeEvent."""
        with self._lock:
            self.events.append(event)

    def reports(self, name: str) -> list[CSIInfo]:
        """Every report of one plugin, oldest first."""
        with self._lock:
            return [info for n, info in self.infos if n == name]

    def last(self, name: str) -> CSIInfo | None:
        """The newest report of one plugin."""
        found = self.reports(name)
        return found[-1] if found else None

    def health_of(self, name: str) -> HealthState | None:
        """The health in the newest report of one plugin."""
        last = self.last(name)
        return None if last is None else last.health

    def csi_events(self, name: str) -> list[str]:
        """The health values of the CSI node events of one plugin, oldest first."""
        with self._lock:
            return [
                e.details["health"]
                for e in self.events
                if e.subsystem == "CSI" and e.details.get("plugin") == name
            ]

    def count(self) -> int:
        """How many reports arrived in all."""
        with self._lock:
            return len(self.infos)


class CallWatch:
    """Makes clients that record every RPC started after :meth:`shutdown_done`."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self._lock = threading.Lock()
        self.strays: list[str] = []
        self.calls = 0

    def shutdown_done(self) -> None:
        """From now on every call is a stray."""
        self.done.set()

    def reset(self) -> None:
        """Start a new round."""
        self.done.clear()

    def factory(self, path: str) -> CSIClient:
        """A client_factory for the manager."""
        return _WatchedClient(self, path, timeout=10)

    def note(self, name: str) -> None:
        """Record a call."""
        with self._lock:
            self.calls += 1
            if self.done.is_set():
                self.strays.append(name)


class _WatchedClient(CSIClient):
    def __init__(self, watch: CallWatch, endpoint: str, *, timeout: float) -> None:
        super().__init__(endpoint, timeout=timeout)
        self._watch = watch

    def call(self, name: str, request: Any, **kwargs: Any) -> Any:
        self._watch.note(name)
        return super().call(name, request, **kwargs)
