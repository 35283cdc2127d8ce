"""The dynamic plugin registry (Nomad's ``dynamicplugins.Registry``).

A node agent that runs CSI drivers as ordinary workloads registers each one here when it
turns healthy and deregisters it when it stops. Plugins are keyed by type
(``csi-controller`` or ``csi-node``) and name; one plugin may have several instances, one
per owner (allocation) id, and the newest registration is the one dispensed.

Every change is broadcast, in order, to every subscriber; a subscriber's queue is unbounded,
so no event is ever dropped. With a ``state_path`` the registry is written to disk
atomically after each change and read back on construction, so a restarted agent finds its
plugins again.
"""

from __future__ import annotations

import collections
import enum
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from kubevol.errors import InvalidPathSegmentError, PluginNotFoundError
from kubevol.layout import validate_path_segment
from kubevol.nomad._state import read_state, write_state
from kubevol.nomad.errors import ManagerStateError, PluginWaitTimeoutError
from kubevol.util.backoff import Backoff

#: ``wait_for_plugin`` polls with this backoff (Nomad's 200 ms to 5 s).
WAIT_BACKOFF = Backoff(initial=0.2, maximum=5.0)

_STATE_KIND = "csi-plugin-registry"


#: An attrs validator of a string field.
_Validator = Callable[[object, "attrs.Attribute[str]", str], None]


class PluginType(enum.StrEnum):
    """What a registered plugin serves."""

    CSI_CONTROLLER = "csi-controller"
    CSI_NODE = "csi-node"


def _segment(what: str) -> _Validator:
    def check(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
        validate_path_segment(value, what)

    return check


def _absolute_path(what: str, *, allow_empty: bool = False) -> _Validator:
    def check(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
        if allow_empty and value == "":
            return
        if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
            raise InvalidPathSegmentError(f"{what} must be an absolute path, got {value!r}")

    return check


def _frozen_map(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class RegisteredPlugin:
    """One running instance of a plugin, as its owner registered it.

    ``mount_root`` is the host directory under which volumes of this plugin are staged and
    published (``staging/`` and ``per-alloc/``); ``plugin_mount_root`` is where the plugin
    itself sees that directory (a container path), empty when it sees the host path.
    ``name`` and ``alloc_id`` become path segments and are validated as such.
    """

    type: PluginType = attrs.field(converter=PluginType)
    name: str = attrs.field(validator=_segment("plugin name"))
    alloc_id: str = attrs.field(validator=_segment("allocation id"))
    socket_path: str = attrs.field(validator=_absolute_path("socket path"))
    mount_root: str = attrs.field(validator=_absolute_path("mount root"))
    plugin_mount_root: str = attrs.field(
        default="", validator=_absolute_path("plugin mount root", allow_empty=True)
    )
    version: str = ""
    options: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)

    @property
    def plugin_root(self) -> str:
        """The mount root as the plugin sees it."""
        return self.plugin_mount_root or self.mount_root

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict; :meth:`from_json` reads it back."""
        return {
            "type": self.type.value,
            "name": self.name,
            "alloc_id": self.alloc_id,
            "socket_path": self.socket_path,
            "mount_root": self.mount_root,
            "plugin_mount_root": self.plugin_mount_root,
            "version": self.version,
            "options": dict(self.options),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RegisteredPlugin:
        """Read :meth:`to_json` output; raises ``ValueError``/``KeyError``/``TypeError``."""
        return cls(
            type=data["type"],
            name=data["name"],
            alloc_id=data["alloc_id"],
            socket_path=data["socket_path"],
            mount_root=data["mount_root"],
            plugin_mount_root=data.get("plugin_mount_root", ""),
            version=data.get("version", ""),
            options=data.get("options") or {},
        )


class RegistryEventType(enum.StrEnum):
    """What happened to a plugin instance."""

    REGISTERED = "registered"
    DEREGISTERED = "deregistered"


@attrs.frozen(kw_only=True)
class RegistryEvent:
    """One change of the registry; ``seq`` grows by one per event, from 1."""

    seq: int
    type: RegistryEventType
    plugin: RegisteredPlugin


class EventSubscription:
    """An ordered, lossless stream of registry events (optionally of one plugin type).

    Events are queued without bound from the moment of :meth:`PluginRegistry.subscribe`.
    Iterate it, or call :meth:`get`; :meth:`close` ends the stream (iteration stops and
    :meth:`get` returns None once the queue is drained).
    """

    def __init__(self, registry: PluginRegistry, plugin_type: PluginType | None) -> None:
        self._registry = registry
        self.plugin_type = plugin_type
        self._queue: collections.deque[RegistryEvent] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False

    def _deliver(self, event: RegistryEvent) -> None:
        if self.plugin_type is not None and event.plugin.type is not self.plugin_type:
            return
        with self._cond:
            if not self._closed:
                self._queue.append(event)
                self._cond.notify_all()

    def get(self, timeout: float | None = None) -> RegistryEvent | None:
        """The next event, waiting up to ``timeout`` seconds (None: forever).

        Returns None on timeout, or when the subscription is closed and drained.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._closed, timeout)
            return self._queue.popleft() if self._queue else None

    def pending(self) -> int:
        """How many events are queued and not yet taken."""
        with self._cond:
            return len(self._queue)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        with self._cond:
            return self._closed

    def close(self) -> None:
        """Stop receiving events and wake every waiter. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._registry._unsubscribe(self)

    def __iter__(self) -> Iterator[RegistryEvent]:
        while True:
            event = self.get()
            if event is None:
                return
            yield event


class PluginRegistry:
    """The registry of running plugin instances. Thread-safe.

    ``state_path``: where the registry persists itself; it is read on construction
    (raising :class:`~kubevol.nomad.errors.ManagerStateError` when unreadable).
    """

    def __init__(self, state_path: str | None = None, *, wait_backoff: Backoff = WAIT_BACKOFF):
        self.state_path = state_path
        self.wait_backoff = wait_backoff
        self._lock = threading.Condition()
        # (type, name) -> instances, newest first.
        self._plugins: dict[tuple[PluginType, str], list[RegisteredPlugin]] = {}
        self._subscribers: list[EventSubscription] = []
        self._seq = 0
        if state_path is not None:
            self._load(state_path)

    # --- persistence ----------------------------------------------------------------

    def _load(self, path: str) -> None:
        data = read_state(path, _STATE_KIND)
        if data is None:
            return
        try:
            if not isinstance(data, dict):
                raise TypeError(f"the state is a {type(data).__name__}, not an object")
            for item in data["plugins"]:
                plugin = RegisteredPlugin.from_json(item)
                self._plugins.setdefault((plugin.type, plugin.name), []).append(plugin)
        except (KeyError, TypeError, ValueError) as exc:
            raise ManagerStateError(f"malformed plugin registry state in {path!r}: {exc}") from exc

    def _persist(self) -> None:
        if self.state_path is None:
            return
        plugins = [p.to_json() for key in sorted(self._plugins) for p in self._plugins[key]]
        write_state(self.state_path, _STATE_KIND, {"plugins": plugins})

    # --- changes --------------------------------------------------------------------

    def _broadcast(self, kind: RegistryEventType, plugin: RegisteredPlugin) -> None:
        self._seq += 1
        event = RegistryEvent(seq=self._seq, type=kind, plugin=plugin)
        for sub in list(self._subscribers):
            sub._deliver(event)
        self._lock.notify_all()

    def register(self, plugin: RegisteredPlugin) -> bool:
        """Register ``plugin`` as the newest instance of its (type, name).

        A new owner id is put first and broadcast as ``registered``. Registering an owner
        id again with different details replaces that instance (moving it first) and is
        broadcast as ``registered`` too, so managers pick up the new socket; registering it
        again unchanged does nothing. Returns whether an event was broadcast. The state is
        persisted before the event goes out; if that fails, the registry is left as it was
        and :class:`~kubevol.nomad.errors.ManagerStateError` is raised.
        """
        key = (plugin.type, plugin.name)
        with self._lock:
            before = self._plugins.get(key, [])
            if plugin in before:
                return False
            others = [p for p in before if p.alloc_id != plugin.alloc_id]
            self._plugins[key] = [plugin, *others]
            try:
                self._persist()
            except ManagerStateError:
                self._restore(key, before)
                raise
            self._broadcast(RegistryEventType.REGISTERED, plugin)
            return True

    def deregister(
        self, plugin_type: PluginType | str, name: str, alloc_id: str
    ) -> RegisteredPlugin | None:
        """Remove the instance of ``name`` owned by ``alloc_id``; broadcast ``deregistered``.

        Idempotent: returns the removed instance, or None (and broadcasts nothing) when no
        instance has that owner. Persists like :meth:`register`.
        """
        key = (PluginType(plugin_type), name)
        with self._lock:
            before = self._plugins.get(key, [])
            removed = next((p for p in before if p.alloc_id == alloc_id), None)
            if removed is None:
                return None
            self._plugins[key] = [p for p in before if p is not removed]
            try:
                self._persist()
            except ManagerStateError:
                self._restore(key, before)
                raise
            self._broadcast(RegistryEventType.DEREGISTERED, removed)
            return removed

    def _restore(self, key: tuple[PluginType, str], before: list[RegisteredPlugin]) -> None:
        if before:
            self._plugins[key] = before
        else:
            self._plugins.pop(key, None)

    # --- queries --------------------------------------------------------------------

    def list_plugins(self, plugin_type: PluginType | str) -> dict[str, RegisteredPlugin]:
        """The newest instance of every registered plugin of ``plugin_type``, by name."""
        ptype = PluginType(plugin_type)
        with self._lock:
            return {
                name: items[0] for (t, name), items in self._plugins.items() if t is ptype and items
            }

    def instances(self, plugin_type: PluginType | str, name: str) -> tuple[RegisteredPlugin, ...]:
        """Every registered instance of one plugin, newest first (empty when none)."""
        with self._lock:
            return tuple(self._plugins.get((PluginType(plugin_type), name), ()))

    def dispense(self, plugin_type: PluginType | str, name: str) -> RegisteredPlugin:
        """The newest instance of a plugin. Raises ``PluginNotFoundError`` when none."""
        found = self.instances(plugin_type, name)
        if not found:
            raise PluginNotFoundError(
                f"no {PluginType(plugin_type).value} plugin {name!r} is registered"
            )
        return found[0]

    def wait_for_plugin(
        self,
        name: str,
        timeout: float,
        *,
        plugin_type: PluginType | str = PluginType.CSI_NODE,
        cancel: threading.Event | None = None,
    ) -> RegisteredPlugin:
        """Wait until an instance of plugin ``name`` (a node plugin unless ``plugin_type``
        says otherwise) is registered and return the newest.

        Checks again after each backoff delay (:data:`WAIT_BACKOFF`: 200 ms doubling to
        5 s), and at once when the registry changes. Raises
        :class:`~kubevol.nomad.errors.PluginWaitTimeoutError` after ``timeout``
        seconds, or when ``cancel`` is set (noticed at the next check).
        """
        ptype = PluginType(plugin_type)
        deadline = time.monotonic() + timeout
        attempt = 0
        with self._lock:
            while True:
                items = self._plugins.get((ptype, name))
                if items:
                    return items[0]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (cancel is not None and cancel.is_set()):
                    raise PluginWaitTimeoutError(
                        f"{ptype.value} plugin {name!r} was not registered within {timeout:g}s"
                    )
                self._lock.wait(min(self.wait_backoff.delay(attempt), remaining))
                attempt += 1

    # --- subscriptions --------------------------------------------------------------

    def subscribe(self, plugin_type: PluginType | str | None = None) -> EventSubscription:
        """A new event stream, from now on, of one plugin type or (None) of all."""
        sub = EventSubscription(self, None if plugin_type is None else PluginType(plugin_type))
        with self._lock:
            self._subscribers.append(sub)
        return sub

    def _unsubscribe(self, sub: EventSubscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def close(self) -> None:
        """Close every subscription (their readers see the end of the stream). Idempotent."""
        with self._lock:
            subs = list(self._subscribers)
        for sub in subs:
            sub.close()
