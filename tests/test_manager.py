"""Covers kubevol.manager.

VolumePluginMgr: registration rules, lookups, typed finders, probing, discovery.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import pytest
from kubernetes import client

from kubevol import (
    AmbiguousPluginError,
    AttachableVolumePlugin,
    BlockVolumePlugin,
    DynamicPluginProber,
    NodeVolumeHost,
    PersistentVolumePlugin,
    PluginNotFoundError,
    PluginValidationError,
    ProbeError,
    ProbeEvent,
    ProbeOperation,
    Spec,
    VolumePlugin,
    VolumePluginMgr,
    VolumePluginWithAttachLimits,
    entry_point_plugins,
)
from kubevol.plugins import builtin_plugins
from kubevol.testing.fake_plugin import FakeVolumePlugin, fake_plugin_with


def named(name: str) -> Spec:
    return Spec.from_volume(client.V1Volume(name=name))


def supports(*names: str):  # type: ignore[no-untyped-def]
    return lambda spec: spec.name() in names


@pytest.fixture
def mgr(host: NodeVolumeHost) -> VolumePluginMgr:
    return VolumePluginMgr()


@pytest.mark.parametrize(
    "bad_name", ["a/b/c", "/csi", "Example.com/x", "x/-bad", "x/" + "n" * 64, ""]
)
def test_invalid_plugin_names_are_refused(
    mgr: VolumePluginMgr, host: NodeVolumeHost, bad_name: str
) -> None:
    """Names that are not qualified names are refused with the name in the message."""
    with pytest.raises(PluginValidationError, match="invalid name"):
        mgr.init_plugins([FakeVolumePlugin(bad_name)], host=host)
    assert mgr.list_plugins() == []


def test_name_without_slash_is_valid(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """A name with no DNS prefix is a valid qualified name."""
    mgr.init_plugins([FakeVolumePlugin("plain")], host=host)
    assert mgr.find_plugin_by_name("plain").get_plugin_name() == "plain"


def test_problems_are_aggregated_and_good_plugins_registered(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """Every problem is reported at once; the valid plugins are still usable."""
    good = FakeVolumePlugin("example.com/good")
    failing = FakeVolumePlugin("example.com/failing", init_error=RuntimeError("no binary"))
    with pytest.raises(PluginValidationError) as info:
        mgr.init_plugins(
            [good, FakeVolumePlugin("a/b/c"), FakeVolumePlugin("example.com/good"), failing],
            host=host,
        )
    problems = info.value.problems
    assert len(problems) == 3
    assert "invalid name 'a/b/c'" in problems[0]
    assert "'example.com/good' was registered more than once" in problems[1]
    assert "failed to init: no binary" in problems[2]
    assert mgr.find_plugin_by_name("example.com/good") is good
    assert good.init_calls == 1
    with pytest.raises(PluginNotFoundError):
        mgr.find_plugin_by_name("example.com/failing")


def test_init_plugins_again_adds_to_the_registry(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """A second init_plugins call adds plugins and still refuses duplicates."""
    mgr.init_plugins([FakeVolumePlugin("example.com/a")], host=host)
    mgr.init_plugins([FakeVolumePlugin("example.com/b")], host=host)
    assert [p.get_plugin_name() for p in mgr.list_plugins()] == ["example.com/a", "example.com/b"]
    with pytest.raises(PluginValidationError, match="more than once"):
        mgr.init_plugins([FakeVolumePlugin("example.com/a")], host=host)


def test_find_by_spec_zero_one_and_several(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """No match raises PluginNotFoundError; several raise AmbiguousPluginError naming them."""
    mgr.init_plugins(
        [
            FakeVolumePlugin("example.com/a", supports("shared", "only-a")),
            FakeVolumePlugin("example.com/b", supports("shared")),
        ],
        host=host,
    )
    assert mgr.find_plugin_by_spec(named("only-a")).get_plugin_name() == "example.com/a"
    with pytest.raises(PluginNotFoundError, match="no volume plugin matched"):
        mgr.find_plugin_by_spec(named("nobody"))
    with pytest.raises(AmbiguousPluginError) as info:
        mgr.find_plugin_by_spec(named("shared"))
    assert info.value.names == ("example.com/a", "example.com/b")
    assert isinstance(info.value, LookupError)
    with pytest.raises(PluginNotFoundError, match="spec is None"):
        mgr.find_plugin_by_spec(None)


def test_find_by_name_unknown(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """An unknown name raises with the name in the message."""
    mgr.init_plugins([], host=host)
    with pytest.raises(PluginNotFoundError, match=r"name: example\.com/missing"):
        mgr.find_plugin_by_name("example.com/missing")


def test_typed_finders_raise_or_return_none_as_kubernetes(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """Persistent/recyclable/deletable/provisionable/limits raise; attachable & co return None."""
    plain = FakeVolumePlugin("example.com/plain", supports("plain"))
    persistent: VolumePlugin = fake_plugin_with(
        PersistentVolumePlugin, name="example.com/pv", supports=supports("pv")
    )
    mgr.init_plugins([plain, persistent], host=host)
    spec = named("plain")
    for finder in (
        mgr.find_persistent_plugin_by_spec,
        mgr.find_recyclable_plugin_by_spec,
        mgr.find_deletable_plugin_by_spec,
        mgr.find_volume_plugin_with_limits_by_spec,
        mgr.find_creatable_plugin_by_spec,
    ):
        with pytest.raises(PluginNotFoundError):
            finder(spec)
    for name_finder in (
        mgr.find_persistent_plugin_by_name,
        mgr.find_provisionable_plugin_by_name,
        mgr.find_deletable_plugin_by_name,
    ):
        with pytest.raises(PluginNotFoundError):
            name_finder("example.com/plain")
    for none_finder in (
        mgr.find_attachable_plugin_by_spec,
        mgr.find_device_mountable_plugin_by_spec,
        mgr.find_expandable_plugin_by_spec,
        mgr.find_mapper_plugin_by_spec,
        mgr.find_node_expandable_plugin_by_spec,
    ):
        assert none_finder(spec) is None
    for none_name_finder in (
        mgr.find_attachable_plugin_by_name,
        mgr.find_device_mountable_plugin_by_name,
        mgr.find_expandable_plugin_by_name,
        mgr.find_mapper_plugin_by_name,
        mgr.find_node_expandable_plugin_by_name,
    ):
        assert none_name_finder("example.com/plain") is None
    assert mgr.find_persistent_plugin_by_spec(named("pv")) is persistent
    assert mgr.find_persistent_plugin_by_name("example.com/pv") is persistent
    # The None-returning finders still raise when no plugin matches at all.
    with pytest.raises(PluginNotFoundError):
        mgr.find_attachable_plugin_by_spec(named("nobody"))


def test_attachable_by_spec_honours_can_attach(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """An attachable plugin that cannot attach this spec is not returned."""
    attachable: VolumePlugin = fake_plugin_with(
        AttachableVolumePlugin, name="example.com/att", supports=supports("disk", "inline")
    )
    attachable.can_attach = lambda spec: spec.name() == "disk"  # type: ignore[attr-defined]
    mgr.init_plugins([attachable], host=host)
    assert mgr.find_attachable_plugin_by_spec(named("disk")) is attachable
    assert mgr.find_attachable_plugin_by_spec(named("inline")) is None
    assert mgr.find_device_mountable_plugin_by_spec(named("disk")) is attachable


def test_roles_in_one_lookup_match_the_typed_finders(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """find_roles_by_spec answers what find_plugin_by_spec and the attachable, device-mountable
    and mapper finders answer together, asking each plugin's can_support once; by name,
    every implemented role, narrowed to a Spec by for_spec."""
    attachable: VolumePlugin = fake_plugin_with(
        AttachableVolumePlugin, BlockVolumePlugin, name="example.com/att",
        supports=supports("disk", "inline"),
    )
    attachable.can_attach = lambda spec: spec.name() == "disk"  # type: ignore[attr-defined]
    attachable.can_device_mount = (  # type: ignore[attr-defined]
        lambda spec: spec.name() == "disk"
    )
    plain = FakeVolumePlugin("example.com/plain", supports("plain"))
    mgr.init_plugins([attachable, plain], host=host)
    asked: list[str] = []
    can_support = attachable.can_support

    def counting(spec: Spec) -> bool:
        asked.append(spec.name())
        return can_support(spec)

    attachable.can_support = counting  # type: ignore[method-assign]
    for name in ("disk", "inline", "plain"):
        spec = named(name)
        roles = mgr.find_roles_by_spec(spec)
        assert roles.plugin is mgr.find_plugin_by_spec(spec)
        assert roles.attachable is mgr.find_attachable_plugin_by_spec(spec)
        assert roles.device_mountable is mgr.find_device_mountable_plugin_by_spec(spec)
        assert roles.mapper is mgr.find_mapper_plugin_by_spec(spec)
    asked.clear()
    mgr.find_roles_by_spec(named("disk"))
    assert asked == ["disk"]
    by_name = mgr.find_roles_by_name("example.com/att")
    assert (by_name.name, by_name.attachable, by_name.device_mountable, by_name.mapper) == (
        "example.com/att", attachable, attachable, attachable
    )
    assert by_name.for_spec(named("disk")) is by_name
    inline = by_name.for_spec(named("inline"))
    assert (inline.attachable, inline.device_mountable, inline.mapper) == (None, None, attachable)
    plain_roles = mgr.find_roles_by_name("example.com/plain")
    assert (plain_roles.attachable, plain_roles.device_mountable, plain_roles.mapper) == (
        None, None, None
    )
    with pytest.raises(PluginNotFoundError):
        mgr.find_roles_by_spec(named("nobody"))
    with pytest.raises(PluginNotFoundError):
        mgr.find_roles_by_name("example.com/missing")


def test_list_volume_plugin_with_limits(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """Only plugins with attach limits are listed."""
    limited: VolumePlugin = fake_plugin_with(
        VolumePluginWithAttachLimits, name="example.com/lim", supports=supports()
    )
    mgr.init_plugins([limited, FakeVolumePlugin("example.com/free")], host=host)
    assert mgr.list_volume_plugin_with_limits() == [limited]


class ScriptedProber(DynamicPluginProber):
    """Returns queued event batches, one per probe; a batch may be a ProbeError."""

    def __init__(self) -> None:
        self.batches: list[list[ProbeEvent] | ProbeError] = []
        self.init_error: Exception | None = None

    def init(self) -> None:
        if self.init_error:
            raise self.init_error

    def probe(self) -> list[ProbeEvent]:
        if not self.batches:
            return []
        batch = self.batches.pop(0)
        if isinstance(batch, ProbeError):
            raise batch
        return batch


def test_prober_add_update_remove_applied_at_lookup(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """Probe events add, replace and remove plugins when a lookup happens."""
    prober = ScriptedProber()
    mgr.init_plugins([], prober, host=host)
    v1 = FakeVolumePlugin("flex.io/drv", supports("x"))
    v2 = FakeVolumePlugin("flex.io/drv", supports("x"))
    prober.batches.append([ProbeEvent(plugin=v1, plugin_name="flex.io/drv",
                                      op=ProbeOperation.ADD_OR_UPDATE)])
    assert mgr.find_plugin_by_spec(named("x")) is v1
    prober.batches.append([ProbeEvent(plugin=v2, plugin_name="flex.io/drv",
                                      op=ProbeOperation.ADD_OR_UPDATE)])
    assert mgr.find_plugin_by_name("flex.io/drv") is v2
    assert v2.init_calls == 1
    prober.batches.append([ProbeEvent(plugin=None, plugin_name="flex.io/drv",
                                      op=ProbeOperation.REMOVE)])
    with pytest.raises(PluginNotFoundError):
        mgr.find_plugin_by_name("flex.io/drv")


def test_prober_events_apply_even_when_probe_fails(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """Events delivered with a ProbeError are still applied; invalid probed plugins skipped."""
    prober = ScriptedProber()
    mgr.init_plugins([], prober, host=host)
    good = FakeVolumePlugin("flex.io/good")
    prober.batches.append(
        ProbeError(
            "one driver directory unreadable",
            [
                ProbeEvent(plugin=good, plugin_name="flex.io/good",
                           op=ProbeOperation.ADD_OR_UPDATE),
                ProbeEvent(plugin=FakeVolumePlugin("a/b/c"), plugin_name="a/b/c",
                           op=ProbeOperation.ADD_OR_UPDATE),
            ],
        )
    )
    assert mgr.find_plugin_by_name("flex.io/good") is good
    assert [p.get_plugin_name() for p in mgr.list_plugins()] == ["flex.io/good"]


def test_prober_whose_init_fails_is_ignored(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """A prober that fails to init is replaced by one that finds nothing."""
    prober = ScriptedProber()
    prober.init_error = RuntimeError("no plugin dir")
    prober.batches.append([ProbeEvent(plugin=FakeVolumePlugin("flex.io/x"),
                                      plugin_name="flex.io/x", op=ProbeOperation.ADD_OR_UPDATE)])
    mgr.init_plugins([], prober, host=host)
    with pytest.raises(PluginNotFoundError):
        mgr.find_plugin_by_name("flex.io/x")


def test_static_and_probed_with_same_name_is_ambiguous(
    mgr: VolumePluginMgr, host: NodeVolumeHost
) -> None:
    """A name in both the static and probed sets is an ambiguous lookup."""
    prober = ScriptedProber()
    mgr.init_plugins([FakeVolumePlugin("flex.io/dup")], prober, host=host)
    prober.batches.append([ProbeEvent(plugin=FakeVolumePlugin("flex.io/dup"),
                                      plugin_name="flex.io/dup",
                                      op=ProbeOperation.ADD_OR_UPDATE)])
    with pytest.raises(AmbiguousPluginError):
        mgr.find_plugin_by_name("flex.io/dup")


def test_lookups_are_safe_from_many_threads(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """Concurrent lookups during probe updates never see a torn registry."""
    prober = ScriptedProber()
    mgr.init_plugins(
        [FakeVolumePlugin(f"example.com/p{i}", supports(f"v{i}")) for i in range(20)],
        prober,
        host=host,
    )
    for i in range(200):
        plugin = FakeVolumePlugin(f"flex.io/p{i}", supports(f"f{i}"))
        prober.batches.append([ProbeEvent(plugin=plugin, plugin_name=plugin.name,
                                          op=ProbeOperation.ADD_OR_UPDATE)])
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(200):
                assert mgr.find_plugin_by_spec(named(f"v{(n + i) % 20}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(mgr.list_plugins()) == 220


def test_entry_point_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plugins advertised in the kubevol.plugins entry-point group are found and loaded."""
    pkg = tmp_path / "kubevol_ep_demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            from kubevol.testing.fake_plugin import FakeVolumePlugin

            def probe_volume_plugins():
                return [FakeVolumePlugin("demo.example.com/ep")]

            def broken():
                raise RuntimeError("cannot start")
            """
        )
    )
    dist = tmp_path / "kubevol_ep_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kubevol-ep-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[kubevol.plugins]\n"
        "demo = kubevol_ep_demo:probe_volume_plugins\n"
        "broken = kubevol_ep_demo:broken\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins, problems = entry_point_plugins()
    assert [p.get_plugin_name() for p in plugins] == ["demo.example.com/ep"]
    assert len(problems) == 1 and "'broken'" in problems[0] and "cannot start" in problems[0]


def test_builtin_plugins_register_cleanly(mgr: VolumePluginMgr, host: NodeVolumeHost) -> None:
    """The shipped plugins pass validation and match their own volume kinds."""
    mgr.init_plugins(builtin_plugins(), host=host)
    empty = Spec.from_volume(client.V1Volume(name="e", empty_dir=client.V1EmptyDirVolumeSource()))
    hp = Spec.from_volume(
        client.V1Volume(name="h", host_path=client.V1HostPathVolumeSource(path="/"))
    )
    assert mgr.find_plugin_by_spec(empty).get_plugin_name() == "kubernetes.io/empty-dir"
    assert mgr.find_persistent_plugin_by_spec(hp).get_plugin_name() == "kubernetes.io/host-path"
