"""``VolumePluginMgr``: registers plugins and finds the one for a name or a volume Spec.

All lookups go through one generic finder (:meth:`VolumePluginMgr._find`); the typed
finders are thin wrappers that keep Kubernetes' split between finders that raise when the
plugin lacks a capability and finders that return ``None``. The node layer, which needs a
volume's plugin *and* every role it plays, asks once: :meth:`VolumePluginMgr.find_roles_by_spec`
(or ``_by_name``) returns :class:`PluginRoles`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import TYPE_CHECKING, TypeVar

import attrs

from kubevol.errors import (
    AmbiguousPluginError,
    PluginNotFoundError,
    PluginValidationError,
    ProbeError,
)
from kubevol.plugin import (
    AttachableVolumePlugin,
    BlockVolumePlugin,
    DeletableVolumePlugin,
    DeviceMountableVolumePlugin,
    DynamicPluginProber,
    ExpandableVolumePlugin,
    NodeExpandableVolumePlugin,
    PersistentVolumePlugin,
    ProbeEvent,
    ProbeOperation,
    ProvisionableVolumePlugin,
    RecyclableVolumePlugin,
    VolumePlugin,
    VolumePluginWithAttachLimits,
)

if TYPE_CHECKING:
    from kubevol.host import VolumeHost
    from kubevol.spec import Spec

log = logging.getLogger(__name__)

P = TypeVar("P", bound=VolumePlugin)

#: Entry-point group through which third-party packages contribute plugins. Each entry
#: point names a callable returning an iterable of plugin instances (Kubernetes'
#: ``ProbeVolumePlugins``).
ENTRY_POINT_GROUP = "kubevol.plugins"

_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def qualified_name_problem(name: str) -> str | None:
    """Why ``name`` is not a qualified name (``[dns-prefix/]name``), or None if it is."""
    parts = name.split("/")
    if len(parts) > 2:
        return "a qualified name has at most one '/'"
    if len(parts) == 2:
        prefix, short = parts
        if not prefix:
            return "the prefix before '/' must not be empty"
        if len(prefix) > 253 or not all(_DNS_LABEL.match(label) for label in prefix.split(".")):
            return "the prefix must be a lowercase DNS subdomain of at most 253 characters"
    else:
        short = parts[0]
    if not short or len(short) > 63:
        return "the name part must be 1 to 63 characters"
    if not _NAME_PART.match(short):
        return (
            "the name part must consist of alphanumerics, '-', '_' or '.', "
            "and start and end with an alphanumeric"
        )
    return None


def entry_point_plugins(group: str = ENTRY_POINT_GROUP) -> tuple[list[VolumePlugin], list[str]]:
    """Load plugins advertised in the entry-point ``group``; returns (plugins, problems)."""
    plugins: list[VolumePlugin] = []
    problems: list[str] = []
    for ep in metadata.entry_points(group=group):
        try:
            found = list(ep.load()())
        except Exception as exc:  # a broken third-party package must not stop the others
            problems.append(f"entry point {ep.name!r} ({ep.value}) failed to load: {exc}")
            continue
        for plugin in found:
            if isinstance(plugin, VolumePlugin):
                plugins.append(plugin)
            else:
                problems.append(
                    f"entry point {ep.name!r} returned {type(plugin).__name__}, "
                    "which is not a VolumePlugin"
                )
    return plugins, problems


@attrs.frozen(kw_only=True)
class PluginRoles:
    """A plugin and the roles it plays, from one lookup: itself as each capability base it
    implements, None for those it does not."""

    plugin: VolumePlugin
    device_mountable: DeviceMountableVolumePlugin | None
    attachable: AttachableVolumePlugin | None
    mapper: BlockVolumePlugin | None

    @classmethod
    def of(cls, plugin: VolumePlugin) -> PluginRoles:
        """Every role ``plugin`` implements."""
        return cls(
            plugin=plugin,
            device_mountable=plugin if isinstance(plugin, DeviceMountableVolumePlugin) else None,
            attachable=plugin if isinstance(plugin, AttachableVolumePlugin) else None,
            mapper=plugin if isinstance(plugin, BlockVolumePlugin) else None,
        )

    @property
    def name(self) -> str:
        """The plugin's name."""
        return self.plugin.get_plugin_name()

    def for_spec(self, spec: Spec) -> PluginRoles:
        """The roles the plugin plays for ``spec``: no device mount unless its
        ``can_device_mount(spec)``, no attach unless its ``can_attach(spec)`` (an inline
        CSI volume has neither), as the typed ``find_*_by_spec`` finders decide. Raises
        what ``can_attach`` raises."""
        device = self.device_mountable
        if device is not None and not device.can_device_mount(spec):
            device = None
        attach = self.attachable
        if attach is not None and not attach.can_attach(spec):
            attach = None
        if device is self.device_mountable and attach is self.attachable:
            return self
        return attrs.evolve(self, device_mountable=device, attachable=attach)


class _NoopProber(DynamicPluginProber):
    def probe(self) -> list[ProbeEvent]:
        return []


class VolumePluginMgr:
    """Tracks plugins; safe to use from many threads.

    Call :meth:`init_plugins` before lookups. Plugins from a dynamic prober are refreshed
    at lookup time.
    """

    def __init__(self) -> None:
        self.host: VolumeHost | None = None
        self._plugins: dict[str, VolumePlugin] = {}
        self._probed: dict[str, VolumePlugin] = {}
        self._prober: DynamicPluginProber = _NoopProber()
        self._lock = threading.RLock()

    def init_plugins(
        self,
        plugins: Iterable[VolumePlugin],
        prober: DynamicPluginProber | None = None,
        *,
        host: VolumeHost,
    ) -> None:
        """Validate and ``init`` each plugin; register the good ones.

        Invalid names, duplicates and ``init`` failures skip that plugin only; once every
        plugin was tried, one :class:`PluginValidationError` lists every problem. Calling
        again adds to what is registered.
        """
        problems: list[str] = []
        with self._lock:
            self.host = host
            host.bind_plugin_mgr(self)
            self._prober = self._init_prober(prober)
            for plugin in plugins:
                problem = self._register(plugin, self._plugins)
                if problem:
                    problems.append(problem)
        if problems:
            raise PluginValidationError(problems)

    @staticmethod
    def _init_prober(prober: DynamicPluginProber | None) -> DynamicPluginProber:
        if prober is None:
            return _NoopProber()
        try:
            prober.init()
        except Exception as exc:  # the kubelet carries on without the prober
            log.error("dynamic plugin prober failed to initialise, ignoring it: %s", exc)
            return _NoopProber()
        return prober

    def _register(self, plugin: VolumePlugin, into: dict[str, VolumePlugin]) -> str | None:
        """Validate and init ``plugin`` into ``into``; returns the problem, if any."""
        name = plugin.get_plugin_name()
        problem = qualified_name_problem(name)
        if problem:
            return f"volume plugin has invalid name {name!r}: {problem}"
        if name in into:
            return f"volume plugin {name!r} was registered more than once"
        assert self.host is not None
        try:
            plugin.init(self.host)
        except Exception as exc:  # a plugin's init may fail in any way; report it, keep going
            return f"volume plugin {name!r} failed to init: {exc}"
        into[name] = plugin
        return None

    def _refresh_probed_plugins(self) -> None:
        try:
            events = self._prober.probe()
            failure: ProbeError | None = None
        except ProbeError as exc:
            events = [e for e in exc.events if isinstance(e, ProbeEvent)]
            failure = exc
        for event in events:
            if event.op is ProbeOperation.ADD_OR_UPDATE and event.plugin is not None:
                self._probed.pop(event.plugin_name, None)
                problem = self._register(event.plugin, self._probed)
                if problem:
                    log.error("skipping probed plugin: %s", problem)
            elif event.op is ProbeOperation.REMOVE:
                self._probed.pop(event.plugin_name, None)
        if failure is not None:
            log.error("dynamic plugin probe failed: %s", failure)

    # -- the one generic lookup -------------------------------------------------------

    def _find(
        self,
        *,
        name: str | None = None,
        spec: Spec | None = None,
        capability: type[P],
        kind: str,
        raise_if_incapable: bool,
        accept: Callable[[P], bool] | None = None,
    ) -> P | None:
        """Find by ``name`` or ``spec``, then check ``capability`` (and ``accept``).

        Lookup failures always raise. A plugin without the capability raises
        PluginNotFoundError when ``raise_if_incapable``, else the result is None.
        """
        plugin = self.find_plugin_by_name(name) if name is not None else self._by_spec(spec)
        if isinstance(plugin, capability) and (accept is None or accept(plugin)):
            return plugin
        if raise_if_incapable:
            raise PluginNotFoundError(
                f"no {kind} volume plugin matched: {plugin.get_plugin_name()!r} is not {kind}"
            )
        return None

    def _by_spec(self, spec: Spec | None) -> VolumePlugin:
        return self.find_plugin_by_spec(spec)

    def find_plugin_by_spec(self, spec: Spec | None) -> VolumePlugin:
        """The one plugin that supports ``spec``.

        Raises PluginNotFoundError when none does and AmbiguousPluginError when several do.
        """
        if spec is None:
            raise PluginNotFoundError("could not find plugin because volume spec is None")
        with self._lock:
            matches = [p for p in self._plugins.values() if p.can_support(spec)]
            self._refresh_probed_plugins()
            matches += [p for p in self._probed.values() if p.can_support(spec)]
        if not matches:
            raise PluginNotFoundError(f"no volume plugin matched spec of volume {spec.name()!r}")
        if len(matches) > 1:
            names = [p.get_plugin_name() for p in matches]
            raise AmbiguousPluginError(
                f"multiple volume plugins matched: {','.join(sorted(names))}", names
            )
        return matches[0]

    def find_plugin_by_name(self, name: str) -> VolumePlugin:
        """The plugin called ``name``, static or probed; raises when none or both have it."""
        with self._lock:
            self._refresh_probed_plugins()
            static = self._plugins.get(name)
            probed = self._probed.get(name)
        if static is not None and probed is not None:
            raise AmbiguousPluginError(
                f"multiple volume plugins matched: {name} (static) and {name} (probed)",
                [name, name],
            )
        found = static or probed
        if found is None:
            raise PluginNotFoundError(f"no volume plugin matched name: {name}")
        return found

    def find_roles_by_spec(self, spec: Spec) -> PluginRoles:
        """The one plugin that supports ``spec`` and the roles it plays for it, in one lookup
        (what :meth:`find_plugin_by_spec` and the typed ``find_*_by_spec`` finders would say
        together). Raises as :meth:`find_plugin_by_spec`, and what ``can_attach`` raises."""
        return PluginRoles.of(self.find_plugin_by_spec(spec)).for_spec(spec)

    def find_roles_by_name(self, name: str) -> PluginRoles:
        """The plugin called ``name`` and every role it implements; narrow them to a Spec
        with :meth:`PluginRoles.for_spec`. Raises as :meth:`find_plugin_by_name`."""
        return PluginRoles.of(self.find_plugin_by_name(name))

    def list_plugins(self) -> list[VolumePlugin]:
        """Every registered plugin, static then probed, sorted by name within each."""
        with self._lock:
            self._refresh_probed_plugins()
            return [
                *sorted(self._plugins.values(), key=lambda p: p.get_plugin_name()),
                *sorted(self._probed.values(), key=lambda p: p.get_plugin_name()),
            ]

    # -- typed finders: raise when the plugin lacks the capability ---------------------

    def find_persistent_plugin_by_spec(self, spec: Spec) -> PersistentVolumePlugin:
        """The persistent plugin for ``spec``; raises if there is none."""
        return self._raising(spec=spec, capability=PersistentVolumePlugin, kind="persistent")

    def find_persistent_plugin_by_name(self, name: str) -> PersistentVolumePlugin:
        """The persistent plugin called ``name``; raises if there is none."""
        return self._raising(name=name, capability=PersistentVolumePlugin, kind="persistent")

    def find_recyclable_plugin_by_spec(self, spec: Spec) -> RecyclableVolumePlugin:
        """The recyclable plugin for ``spec``; raises if there is none."""
        return self._raising(spec=spec, capability=RecyclableVolumePlugin, kind="recyclable")

    def find_provisionable_plugin_by_name(self, name: str) -> ProvisionableVolumePlugin:
        """The provisionable plugin called ``name``; raises if there is none."""
        return self._raising(
            name=name, capability=ProvisionableVolumePlugin, kind="provisionable"
        )

    def find_creatable_plugin_by_spec(self, spec: Spec) -> ProvisionableVolumePlugin:
        """The provisionable plugin for ``spec``; raises if there is none."""
        return self._raising(
            spec=spec, capability=ProvisionableVolumePlugin, kind="provisionable"
        )

    def find_deletable_plugin_by_spec(self, spec: Spec) -> DeletableVolumePlugin:
        """The deletable plugin for ``spec``; raises if there is none."""
        return self._raising(spec=spec, capability=DeletableVolumePlugin, kind="deletable")

    def find_deletable_plugin_by_name(self, name: str) -> DeletableVolumePlugin:
        """The deletable plugin called ``name``; raises if there is none."""
        return self._raising(name=name, capability=DeletableVolumePlugin, kind="deletable")

    def find_volume_plugin_with_limits_by_spec(self, spec: Spec) -> VolumePluginWithAttachLimits:
        """The plugin with attach limits for ``spec``; raises if there is none."""
        return self._raising(
            spec=spec, capability=VolumePluginWithAttachLimits, kind="attach-limited"
        )

    def _raising(
        self,
        *,
        capability: type[P],
        kind: str,
        name: str | None = None,
        spec: Spec | None = None,
    ) -> P:
        found = self._find(
            name=name, spec=spec, capability=capability, kind=kind, raise_if_incapable=True
        )
        assert found is not None
        return found

    # -- typed finders: None when the plugin lacks the capability ----------------------

    def find_attachable_plugin_by_spec(self, spec: Spec) -> AttachableVolumePlugin | None:
        """The attachable plugin for ``spec`` if it can attach it, else None."""
        return self._find(
            spec=spec,
            capability=AttachableVolumePlugin,
            kind="attachable",
            raise_if_incapable=False,
            accept=lambda p: p.can_attach(spec),
        )

    def find_attachable_plugin_by_name(self, name: str) -> AttachableVolumePlugin | None:
        """The plugin called ``name`` if it is attachable, else None."""
        return self._find(
            name=name, capability=AttachableVolumePlugin, kind="attachable",
            raise_if_incapable=False,
        )

    def find_device_mountable_plugin_by_spec(
        self, spec: Spec
    ) -> DeviceMountableVolumePlugin | None:
        """The device-mountable plugin for ``spec`` if it device-mounts it, else None."""
        return self._find(
            spec=spec,
            capability=DeviceMountableVolumePlugin,
            kind="device-mountable",
            raise_if_incapable=False,
            accept=lambda p: p.can_device_mount(spec),
        )

    def find_device_mountable_plugin_by_name(
        self, name: str
    ) -> DeviceMountableVolumePlugin | None:
        """The plugin called ``name`` if it is device-mountable, else None."""
        return self._find(
            name=name, capability=DeviceMountableVolumePlugin, kind="device-mountable",
            raise_if_incapable=False,
        )

    def find_expandable_plugin_by_spec(self, spec: Spec) -> ExpandableVolumePlugin | None:
        """The expandable plugin for ``spec``, else None."""
        return self._find(
            spec=spec, capability=ExpandableVolumePlugin, kind="expandable",
            raise_if_incapable=False,
        )

    def find_expandable_plugin_by_name(self, name: str) -> ExpandableVolumePlugin | None:
        """The plugin called ``name`` if it is expandable, else None."""
        return self._find(
            name=name, capability=ExpandableVolumePlugin, kind="expandable",
            raise_if_incapable=False,
        )

    def find_mapper_plugin_by_spec(self, spec: Spec) -> BlockVolumePlugin | None:
        """The block plugin for ``spec``, else None."""
        return self._find(
            spec=spec, capability=BlockVolumePlugin, kind="block", raise_if_incapable=False
        )

    def find_mapper_plugin_by_name(self, name: str) -> BlockVolumePlugin | None:
        """The plugin called ``name`` if it maps block volumes, else None."""
        return self._find(
            name=name, capability=BlockVolumePlugin, kind="block", raise_if_incapable=False
        )

    def find_node_expandable_plugin_by_spec(
        self, spec: Spec
    ) -> NodeExpandableVolumePlugin | None:
        """The node-expandable plugin for ``spec``, else None."""
        return self._find(
            spec=spec, capability=NodeExpandableVolumePlugin, kind="node-expandable",
            raise_if_incapable=False,
        )

    def find_node_expandable_plugin_by_name(
        self, name: str
    ) -> NodeExpandableVolumePlugin | None:
        """The plugin called ``name`` if it is node-expandable, else None."""
        return self._find(
            name=name, capability=NodeExpandableVolumePlugin, kind="node-expandable",
            raise_if_incapable=False,
        )

    def list_volume_plugin_with_limits(self) -> list[VolumePluginWithAttachLimits]:
        """Every static plugin with attach limits."""
        with self._lock:
            plugins = self._plugins.values()
            return [p for p in plugins if isinstance(p, VolumePluginWithAttachLimits)]
