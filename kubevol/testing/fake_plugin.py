"""A configurable fake volume plugin, for testing code that finds and dispatches plugins."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import NoReturn

from kubevol.host import VolumeHost
from kubevol.k8s.pod import Pod
from kubevol.plugin import VolumePlugin
from kubevol.spec import Spec
from kubevol.types import ReconstructedVolume, VolumeOptions
from kubevol.volume import Mounter, Unmounter


class FakeVolumePlugin(VolumePlugin):
    """A plugin named ``name`` that supports the specs ``supports`` accepts.

    ``init_error`` makes ``init`` raise it; ``init_calls`` counts calls. Mounting is not
    implemented: subclass it, or use a real plugin, for that.
    """

    def __init__(
        self,
        name: str,
        supports: Callable[[Spec], bool] = lambda spec: False,
        *,
        init_error: BaseException | None = None,
    ) -> None:
        self.name = name
        self.supports = supports
        self.init_error = init_error
        self.init_calls = 0
        self.host: VolumeHost | None = None

    def init(self, host: VolumeHost) -> None:
        self.init_calls += 1
        self.host = host
        if self.init_error is not None:
            raise self.init_error

    def get_plugin_name(self) -> str:
        return self.name

    def get_volume_name(self, spec: Spec) -> str:
        return spec.name()

    def can_support(self, spec: Spec) -> bool:
        return self.supports(spec)

    def new_mounter(self, spec: Spec, pod: Pod, opts: VolumeOptions) -> Mounter:
        raise NotImplementedError(f"{self.name} is a fake plugin without a mounter")

    def new_unmounter(self, volume_name: str, pod_uid: str) -> Unmounter:
        raise NotImplementedError(f"{self.name} is a fake plugin without an unmounter")

    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        raise NotImplementedError(f"{self.name} is a fake plugin: nothing to reconstruct")


def fake_plugin_with(
    *capabilities: type[VolumePlugin], name: str, supports: Callable[[Spec], bool]
) -> FakeVolumePlugin:
    """A FakeVolumePlugin that also subclasses ``capabilities``, their abstract methods stubbed.

    The stubs raise NotImplementedError; the manager only needs ``isinstance`` (and
    ``can_attach``/``can_device_mount``, which have defaults).
    """
    def stub(method_name: str) -> Callable[..., NoReturn]:
        def method(self: object, *args: object, **kwargs: object) -> NoReturn:
            raise NotImplementedError(f"{name}.{method_name} is a stub")

        return method

    abstract = set().union(*(getattr(c, "__abstractmethods__", set()) for c in capabilities))
    namespace = {m: stub(m) for m in abstract if not hasattr(FakeVolumePlugin, m)}
    cls = abc.ABCMeta(
        "Fake" + "".join(c.__name__ for c in capabilities), (FakeVolumePlugin, *capabilities),
        namespace,
    )
    plugin: FakeVolumePlugin = cls(name, supports)
    return plugin
