"""The node's registry of CSI drivers (the kubelet's ``csiDrivers`` store and its
``RegistrationHandler``): which drivers are registered, at which endpoint, with which CSI
version and which node information.

Version rules are the kubelet's: a driver must report at least one version; versions
with a major above 1 are ignored; the highest remaining one must be 1.x; a driver already
registered under the same name can only be replaced by one reporting a strictly higher
version. Registration asks the driver ``NodeGetInfo`` (2 minutes by default) and undoes
itself when that fails.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence

import attrs

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.errors import KubevolError

log = logging.getLogger(__name__)

#: The kubelet's ``csiTimeout``: how long ``NodeGetInfo`` may take at registration.
NODE_INFO_TIMEOUT = 120.0

# utilversion.ParseGeneric: optional "v", at least two dotted numbers, then anything.
_GENERIC_VERSION = re.compile(r"^\s*v?([0-9]+(?:\.[0-9]+)+)(.*)$")


class DriverNotRegisteredError(KubevolError, LookupError):
    """No CSI driver of that name is registered on this node."""


class DriverRegistrationError(KubevolError, ValueError):
    """A CSI driver could not be validated or registered; the message says why."""


@attrs.frozen(kw_only=True, order=True)
class CSIVersion:
    """A generic version (``1.2`` or ``v1.10.0``), compared component by component."""

    components: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> CSIVersion:
        """Parse like the kubelet's ``ParseGeneric``; raises ValueError naming ``text``."""
        match = _GENERIC_VERSION.match(text)
        if match is None:
            raise ValueError(f"could not parse {text!r} as a version")
        return cls(components=tuple(int(p) for p in match.group(1).split(".")))

    @property
    def major(self) -> int:
        """The first component."""
        return self.components[0]

    def less_than(self, other: CSIVersion) -> bool:
        """Component-wise comparison, missing components counting as 0."""
        width = max(len(self.components), len(other.components))
        mine = self.components + (0,) * (width - len(self.components))
        theirs = other.components + (0,) * (width - len(other.components))
        return mine < theirs

    def __str__(self) -> str:
        return ".".join(str(c) for c in self.components)


def highest_supported_version(versions: Sequence[str]) -> CSIVersion:
    """The highest 1.x version in ``versions`` (majors above 1 ignored).

    Raises ValueError when the list is empty, nothing parses, or the highest is not 1.x.
    """
    if not versions:
        raise ValueError("CSI driver reporting empty array for supported versions")
    highest: CSIVersion | None = None
    problem = ""
    for text in reversed(versions):
        try:
            version = CSIVersion.parse(text)
        except ValueError as exc:
            problem = str(exc)
            continue
        if version.major > 1:
            # CSI has only had 0.x and 1.x; a 2.x need not be compatible with this client.
            continue
        if highest is None or highest.less_than(version):
            highest = version
    if highest is None:
        raise ValueError(
            f"could not find a highest supported version from versions {list(versions)} "
            f"reported by this driver: {problem or 'all of them are above 1.x'}"
        )
    if highest.major != 1:
        raise ValueError(f"highest supported version reported by driver is {highest}, must be v1.x")
    return highest


@attrs.frozen(kw_only=True)
class RegisteredDriver:
    """A registered CSI driver: where to reach it and what it said about this node."""

    name: str
    endpoint: str
    version: CSIVersion
    node_info: t.NodeInfo


#: Called with ("registered" | "deregistered", driver) after each change.
RegistryListener = Callable[[str, RegisteredDriver], None]

#: Builds the client for a driver's endpoint (tests may count or wrap clients).
ClientFactory = Callable[[str], CSIClient]


class DriverRegistry:
    """CSI drivers registered on this node, each with one long-lived :class:`CSIClient`.

    Thread-safe. ``client_timeout`` is the default per-call timeout of the clients it makes.
    Close it when done: it closes every client.
    """

    def __init__(
        self,
        *,
        node_info_timeout: float = NODE_INFO_TIMEOUT,
        client_timeout: float = NODE_INFO_TIMEOUT,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.node_info_timeout = node_info_timeout
        self._client_factory: ClientFactory = client_factory or (
            lambda endpoint: CSIClient(endpoint, timeout=client_timeout)
        )
        self._drivers: dict[str, RegisteredDriver] = {}
        self._clients: dict[str, CSIClient] = {}
        self._listeners: list[RegistryListener] = []
        self._lock = threading.RLock()
        self._closing = False

    def add_listener(self, listener: RegistryListener) -> None:
        """Call ``listener`` after every registration and deregistration."""
        with self._lock:
            self._listeners.append(listener)

    def validate(
        self, name: str, endpoint: str, versions: Sequence[str], *, caller: str = "ValidatePlugin"
    ) -> CSIVersion:
        """The kubelet's ``ValidatePlugin``: check the versions without registering.

        Returns the highest supported version; raises :class:`DriverRegistrationError`.
        """
        if not name:
            raise DriverRegistrationError(f"{caller} failed: the CSI driver name is empty")
        if not versions:
            raise DriverRegistrationError(
                f"{caller} for CSI driver {name!r} failed. "
                "Plugin returned an empty list for supported versions"
            )
        try:
            version = highest_supported_version(versions)
        except ValueError as exc:
            raise DriverRegistrationError(
                f"{caller} for CSI driver {name!r} failed. None of the versions specified "
                f"{list(versions)} are supported. err={exc}"
            ) from exc
        with self._lock:
            existing = self._drivers.get(name)
        if existing is not None and not existing.version.less_than(version):
            raise DriverRegistrationError(
                f"{caller} for CSI driver {name!r} failed. Another driver with the same name is "
                f"already registered with a higher supported version: {existing.version}"
            )
        return version

    def register_driver(
        self, name: str, endpoint: str, versions: Sequence[str]
    ) -> RegisteredDriver:
        """Register (or upgrade) driver ``name`` at ``endpoint`` and ask it ``NodeGetInfo``.

        Raises :class:`DriverRegistrationError` when the versions are refused or
        ``NodeGetInfo`` fails; in the latter case the driver ends up unregistered, as in
        the kubelet (even one registered before under the same name).
        """
        version = self.validate(name, endpoint, versions, caller="RegisterPlugin")
        client = self._client_factory(endpoint)
        with self._lock:
            old = self._clients.pop(name, None)
            self._clients[name] = client
        if old is not None:
            old.close()
        try:
            info = client.node_get_info(timeout=self.node_info_timeout)
        except Exception as exc:
            self.deregister_driver(name)
            raise DriverRegistrationError(
                f"RegisterPlugin for CSI driver {name!r} at {endpoint} failed: "
                f"NodeGetInfo: {exc}"
            ) from exc
        driver = RegisteredDriver(name=name, endpoint=endpoint, version=version, node_info=info)
        with self._lock:
            if self._clients.get(name) is not client:
                # Deregistered (or replaced) while NodeGetInfo ran: do not resurrect it.
                raise DriverRegistrationError(
                    f"CSI driver {name!r} was deregistered while it registered"
                )
            self._drivers[name] = driver
            listeners = list(self._listeners)
        log.info("registered CSI driver %s at %s (CSI %s, node id %s)",
                 name, endpoint, version, info.node_id)
        for listener in listeners:
            listener("registered", driver)
        return driver

    def deregister_driver(self, name: str) -> None:
        """Forget driver ``name`` and close its client. Idempotent."""
        with self._lock:
            driver = self._drivers.pop(name, None)
            client = self._clients.pop(name, None)
            listeners = list(self._listeners)
        if client is not None:
            client.close()
        if driver is not None:
            log.info("deregistered CSI driver %s", name)
            for listener in listeners:
                listener("deregistered", driver)

    def get(self, name: str) -> RegisteredDriver:
        """The registered driver ``name``; raises :class:`DriverNotRegisteredError`."""
        with self._lock:
            driver = self._drivers.get(name)
        if driver is None:
            raise DriverNotRegisteredError(
                f"driver name {name} not found in the list of registered CSI drivers"
            )
        return driver

    def client(self, name: str) -> CSIClient:
        """The client of registered driver ``name``; raises :class:`DriverNotRegisteredError`."""
        with self._lock:
            client = self._clients.get(name) if name in self._drivers else None
        if client is None:
            raise DriverNotRegisteredError(
                f"driver name {name} not found in the list of registered CSI drivers"
            )
        return client

    def drivers(self) -> list[RegisteredDriver]:
        """Every registered driver, by name."""
        with self._lock:
            return [self._drivers[n] for n in sorted(self._drivers)]

    def is_registered(self, name: str) -> bool:
        """Whether driver ``name`` is registered."""
        with self._lock:
            return name in self._drivers

    @property
    def closing(self) -> bool:
        """Whether :meth:`close` is deregistering the drivers (listeners may tell a driver
        that went from a registry that shuts down)."""
        return self._closing

    def close_idle_channels(self, idle_for: float) -> int:
        """Close the channel of each driver's client that made no call for ``idle_for``
        seconds (:meth:`CSIClient.close_if_idle`: the next call opens one again); how many
        were closed."""
        with self._lock:
            clients = list(self._clients.values())
        return sum(client.close_if_idle(idle_for) for client in clients)

    def close(self) -> None:
        """Deregister every driver (closing the clients). Idempotent."""
        with self._lock:
            self._closing = True
            names = list(self._drivers) + [n for n in self._clients if n not in self._drivers]
        for name in names:
            self.deregister_driver(name)
