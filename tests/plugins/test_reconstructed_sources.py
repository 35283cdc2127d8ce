"""Covers kubevol.spec's reconstructed sources against kubevol.plugins' models.

The sources reconstructed Specs carry (so that a scan builds no kubernetes model) read
exactly like the sources of the models built from the same data."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from kubevol import NodeVolumeHost, Spec, VolumeOptions, VolumePluginMgr
from kubevol.plugins import (
    ConfigMapPlugin,
    DownwardAPIPlugin,
    EmptyDirPlugin,
    ProjectedPlugin,
    SecretPlugin,
)
from kubevol.plugins.atomic_volume import AtomicVolume, AtomicVolumePlugin
from kubevol.plugins.empty_dir import EmptyDir
from kubevol.spec import DeferredApiObject

UID = "pod-uid-1"


def _refuse_models(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(type_name: str, data: object) -> None:
        raise AssertionError(f"a {type_name} model was built")

    monkeypatch.setattr("kubevol.spec.api_object", refuse)


def assert_reads_like(known: Any, model: Any) -> None:
    """Every field of the model's class reads the same on ``known``."""
    assert model is not None
    for field in type(model).model_fields:
        assert getattr(known, field) == getattr(model, field), field


@pytest.fixture
def mgr(host: NodeVolumeHost) -> VolumePluginMgr:
    mgr = VolumePluginMgr()
    mgr.init_plugins([EmptyDirPlugin(), ConfigMapPlugin(), SecretPlugin(), DownwardAPIPlugin(),
                      ProjectedPlugin()], host=host)
    return mgr


@pytest.mark.parametrize("name", [
    "kubernetes.io/configmap", "kubernetes.io/secret", "kubernetes.io/downward-api",
    "kubernetes.io/projected",
])
def test_atomic_volume_sources_read_like_their_models(
    mgr: VolumePluginMgr, host: NodeVolumeHost, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A reconstructed configMap/secret/downwardAPI/projected Spec answers its plugin's
    questions (supported, volume name, mounter path) without a model, and the same as the
    model-backed Spec of its built volume."""
    plugin = mgr.find_plugin_by_name(name)
    assert isinstance(plugin, AtomicVolumePlugin)
    pod = DeferredApiObject("V1Pod", {"metadata": {"uid": UID}})
    spec = plugin.construct_volume_spec("vol", host.get_pod_volume_dir(UID, name, "vol")).spec
    with monkeypatch.context() as m:
        _refuse_models(m)
        asked = (plugin.can_support(spec), plugin.get_volume_name(spec),
                 plugin.new_mounter(spec, pod, VolumeOptions()).get_path())
        known = plugin.new_mounter(spec, pod, VolumeOptions()).source
    built = Spec.from_volume(spec.volume)
    mounter = plugin.new_mounter(built, pod.model(), VolumeOptions())
    assert isinstance(mounter, AtomicVolume)
    assert asked == (plugin.can_support(built), plugin.get_volume_name(built), mounter.get_path())
    assert_reads_like(known, mounter.source)


@pytest.mark.root
@pytest.mark.parametrize("memory", [False, True])
def test_empty_dir_sources_read_like_their_models(
    mgr: VolumePluginMgr, host: NodeVolumeHost, node_root: Path,
    monkeypatch: pytest.MonkeyPatch, memory: bool,
) -> None:
    """A reconstructed emptyDir Spec (disk, or Memory when a tmpfs is mounted there) gives
    the same mounter as the model-backed Spec of its built volume, without a model."""
    plugin = mgr.find_plugin_by_name("kubernetes.io/empty-dir")
    path = Path(host.get_pod_volume_dir(UID, "kubernetes.io/empty-dir", "scratch"))
    path.mkdir(parents=True)
    if memory:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], check=True)
    try:
        spec = plugin.construct_volume_spec("scratch", str(path)).spec
    finally:
        if memory:
            subprocess.run(["umount", str(path)], check=True)
    pod = DeferredApiObject("V1Pod", {"metadata": {"uid": UID}})
    with monkeypatch.context() as m:
        _refuse_models(m)
        mounter = plugin.new_mounter(spec, pod, VolumeOptions())
        asked = (plugin.can_support(spec), plugin.get_volume_name(spec), mounter.get_path())
    built = Spec.from_volume(spec.volume)
    assert (spec.volume.empty_dir.medium == "Memory") is memory
    again = plugin.new_mounter(built, pod.model(), VolumeOptions())
    assert isinstance(mounter, EmptyDir) and isinstance(again, EmptyDir)
    assert asked == (plugin.can_support(built), plugin.get_volume_name(built), again.get_path())
    assert vars(mounter) == vars(again)
