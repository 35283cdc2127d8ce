"""A small attachable, device-mountable plugin for the node tests, with real mounts.

``example.com/staged`` serves PersistentVolumes with a ``local.path`` source. Attaching
records the volume in ``attached.json``; mounting the device bind-mounts the source at
``plugins/example.com/staged/mounts/<pv>`` and writes ``meta/<pv>.json`` (what
reconstruction reads back); set-up bind-mounts the device mount into the pod's volume
directory. ``faults`` injects errors: ``faults["set_up"] = (exc, after)`` raises ``exc``
before the step, or after doing it when ``after`` is true (an uncertain outcome).
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from kubevol.errors import SpecError
from kubevol.host import VolumeHost
from kubevol.mount.guard import UnmountVerdict
from kubevol.mount.helpers import cleanup_mount_point
from kubevol.plugin import (
    AttachableVolumePlugin,
    NodeExpandableVolumePlugin,
    PersistentVolumePlugin,
)
from kubevol.spec import Spec
from kubevol.types import (
    Attributes,
    DeviceMounterArgs,
    MounterArgs,
    NodeResizeOptions,
    ReconstructedVolume,
    VolumeOptions,
)
from kubevol.volume import Attacher, Detacher, Metrics, Mounter, Unmounter

PLUGIN_NAME = "example.com/staged"


class Faults:
    """Errors to raise in named steps, once each. Thread-safe."""

    def __init__(self) -> None:
        self._faults: dict[str, tuple[BaseException, bool]] = {}
        self._lock = threading.Lock()
        self.calls: list[str] = []

    def set(self, step: str, exc: BaseException, *, after: bool = False) -> None:
        """Raise ``exc`` at the next ``step`` (after doing it when ``after``)."""
        with self._lock:
            self._faults[step] = (exc, after)

    def check(self, step: str, *, after: bool) -> None:
        with self._lock:
            if not after:
                self.calls.append(step)
            fault = self._faults.get(step)
            if fault is None or fault[1] != after:
                return
            del self._faults[step]
        raise fault[0]


def _source(spec: Spec) -> str:
    pv = spec.persistent_volume
    local = getattr(getattr(pv, "spec", None), "local", None) if pv is not None else None
    if local is None or not local.path:
        raise SpecError(f"volume {spec.name()!r} is not a local volume")
    return str(local.path)


class StagedPlugin(AttachableVolumePlugin, PersistentVolumePlugin, NodeExpandableVolumePlugin):
    """See the module docstring. ``expansions`` records node expansions (new, old size)."""

    def __init__(self) -> None:
        self._host: VolumeHost | None = None
        self.faults = Faults()
        self._lock = threading.Lock()
        self.expansions: list[tuple[int, int]] = []

    def requires_fs_resize(self) -> bool:
        return True

    def node_expand(self, options: NodeResizeOptions) -> bool:
        self.faults.check("node_expand", after=False)
        self.expansions.append((options.new_size, options.old_size))
        return True

    @property
    def host(self) -> VolumeHost:
        assert self._host is not None
        return self._host

    def init(self, host: VolumeHost) -> None:
        self._host = host

    def get_plugin_name(self) -> str:
        return PLUGIN_NAME

    def get_volume_name(self, spec: Spec) -> str:
        _source(spec)
        return spec.name()

    def can_support(self, spec: Spec) -> bool:
        try:
            _source(spec)
        except SpecError:
            return False
        return True

    def get_access_modes(self) -> list[str]:
        return ["ReadWriteOnce"]

    def base(self) -> str:
        return self.host.get_plugin_dir(PLUGIN_NAME)

    def meta_path(self, pv_name: str) -> str:
        return os.path.join(self.base(), "meta", pv_name + ".json")

    def attached(self) -> set[str]:
        try:
            with open(os.path.join(self.base(), "attached.json"), encoding="utf-8") as f:
                return set(json.load(f))
        except FileNotFoundError:
            return set()

    def _set_attached(self, names: set[str]) -> None:
        os.makedirs(self.base(), exist_ok=True)
        with open(os.path.join(self.base(), "attached.json"), "w", encoding="utf-8") as f:
            json.dump(sorted(names), f)

    def new_mounter(self, spec: Spec, pod: Any, opts: VolumeOptions) -> PodBind:
        return PodBind(self, spec.name(), str(pod.metadata.uid))

    def new_unmounter(self, volume_name: str, pod_uid: str) -> PodBind:
        return PodBind(self, volume_name, pod_uid)

    def construct_volume_spec(self, volume_name: str, volume_path: str) -> ReconstructedVolume:
        with open(self.meta_path(volume_name), encoding="utf-8") as f:
            meta = json.load(f)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume_name},
            "spec": {"local": {"path": meta["source"]}, "capacity": {"storage": "1Mi"}},
        }
        return ReconstructedVolume(spec=Spec.from_manifest(pv))

    def new_attacher(self) -> StagedAttacher:
        return StagedAttacher(self)

    def new_detacher(self) -> StagedAttacher:
        return StagedAttacher(self)

    def new_device_mounter(self) -> StagedAttacher:
        return StagedAttacher(self)

    def new_device_unmounter(self) -> StagedAttacher:
        return StagedAttacher(self)

    def get_device_mount_refs(self, device_mount_path: str) -> list[str]:
        return self.host.get_mounter().get_mount_refs(device_mount_path)


class StagedAttacher(Attacher, Detacher):
    """Attach bookkeeping and the device (staging) bind mount."""

    def __init__(self, plugin: StagedPlugin) -> None:
        self.plugin = plugin

    def attach(self, spec: Spec, node_name: str) -> str:
        self.plugin.faults.check("attach", after=False)
        with self.plugin._lock:
            self.plugin._set_attached(self.plugin.attached() | {spec.name()})
        return _source(spec)

    def volumes_are_attached(self, specs: Sequence[Spec], node_name: str) -> dict[Spec, bool]:
        attached = self.plugin.attached()
        return {s: s.name() in attached for s in specs}

    def wait_for_attach(
        self, spec: Spec, device_path: str, pod: Any, timeout: datetime.timedelta
    ) -> str:
        if spec.name() not in self.plugin.attached():
            raise SpecError(f"{spec.name()} is not attached")
        return _source(spec)

    def detach(self, volume_name: str, node_name: str) -> None:
        self.plugin.faults.check("detach", after=False)
        with self.plugin._lock:
            self.plugin._set_attached(self.plugin.attached() - {volume_name})

    def get_device_mount_path(self, spec: Spec) -> str:
        return os.path.join(self.plugin.base(), "mounts", spec.name())

    def mount_device(
        self, spec: Spec, device_path: str, device_mount_path: str, args: DeviceMounterArgs
    ) -> None:
        self.plugin.faults.check("mount_device", after=False)
        meta = self.plugin.meta_path(spec.name())
        os.makedirs(os.path.dirname(meta), exist_ok=True)
        with open(meta, "w", encoding="utf-8") as f:
            json.dump({"source": device_path}, f)
        os.makedirs(device_mount_path, exist_ok=True)
        mounter = self.plugin.host.get_mounter()
        if mounter.is_likely_not_mount_point(device_mount_path):
            mounter.mount(device_path, device_mount_path, "", ["bind"])
        self.plugin.faults.check("mount_device", after=True)

    def unmount_device(
        self, device_mount_path: str, *, verdict: UnmountVerdict | None = None
    ) -> None:
        self.plugin.faults.check("unmount_device", after=False)
        cleanup_mount_point(device_mount_path, self.plugin.host.get_mounter())
        name = os.path.basename(device_mount_path)
        meta = self.plugin.meta_path(name)
        if os.path.exists(meta):
            os.unlink(meta)


class PodBind(Mounter, Unmounter):
    """The pod's bind mount of the device mount."""

    def __init__(self, plugin: StagedPlugin, pv_name: str, pod_uid: str) -> None:
        self.plugin = plugin
        self.pv_name = pv_name
        self.pod_uid = pod_uid

    def get_path(self) -> str:
        return self.plugin.host.get_pod_volume_dir(self.pod_uid, PLUGIN_NAME, self.pv_name)

    def get_metrics(self) -> Metrics:
        from kubevol.metrics import MetricsStatFS

        return MetricsStatFS(self.get_path()).get_metrics()

    def can_mount(self) -> None:
        """Nothing needed."""

    def get_attributes(self) -> Attributes:
        return Attributes()

    def set_up_at(self, directory: str, args: MounterArgs) -> None:
        self.plugin.faults.check("set_up", after=False)
        staged = os.path.join(self.plugin.base(), "mounts", self.pv_name)
        os.makedirs(directory, exist_ok=True)
        mounter = self.plugin.host.get_mounter()
        if mounter.is_likely_not_mount_point(directory):
            mounter.mount(staged, directory, "", ["bind"])
        self.plugin.faults.check("set_up", after=True)

    def tear_down_at(self, directory: str) -> None:
        self.plugin.faults.check("tear_down", after=False)
        cleanup_mount_point(directory, self.plugin.host.get_mounter())


def local_pv_manifest(name: str, source: str, size: str = "1Mi") -> dict[str, Any]:
    """A PersistentVolume the fake plugin serves, bound to claim ``<name>-claim``."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "local": {"path": source},
            "claimRef": {"name": f"{name}-claim", "namespace": "default"},
        },
    }


def claim_manifest(pv_name: str) -> dict[str, Any]:
    """The claim bound to :func:`local_pv_manifest`'s volume."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{pv_name}-claim", "namespace": "default"},
        "spec": {"volumeName": pv_name, "accessModes": ["ReadWriteOnce"]},
    }


def pod_manifest(name: str, volumes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A pod called ``name`` with ``volumes`` mounted in one container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "volumeMounts": [
                        {"name": v["name"], "mountPath": "/" + v["name"]} for v in volumes
                    ],
                }
            ],
            "volumes": list(volumes),
        },
    }
