"""Covers kubevol.plugins.csi.voldata, kubevol.plugins.csi.metrics, kubevol.plugins.csi.expander.

Rebuilding specs from vol_data.json, metrics through NodeGetVolumeStats, expansion, names
and limits."""

from __future__ import annotations

import json
import os

import pytest
from kubernetes.client import V1EmptyDirVolumeSource, V1Volume

from kubevol.csi import types as t
from kubevol.errors import MetricsError, MetricsErrorCode, OperationError, SpecError
from kubevol.plugins.csi import (
    VolumeDataError,
    VolumeDataMissingError,
    attach_limit_key,
    load_volume_data,
    save_volume_data,
)
from kubevol.plugins.csi.driverinfo import LocalCSIDrivers
from kubevol.plugins.csi.source import csi_source
from kubevol.spec import DeferredApiObject, Spec
from kubevol.types import DeviceMounterArgs, MounterArgs, NodeResizeOptions, VolumeOptions
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME
from tests.plugins.csi.plugin.rig import POD_UID, Rig, RigFactory, inline_spec, make_pod, pv_spec


def _publish(rig: Rig, name: str = "pv-a", handle: str = "h-1") -> tuple[str, str]:
    spec = pv_spec(name, handle)
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    return dmp, mounter.get_path()


@pytest.mark.root
def test_construct_volume_spec_from_vol_data(rig: Rig) -> None:
    """A published persistent volume is rebuilt as a Filesystem CSI PersistentVolume named by
    specVolID with its driver and handle, and gets the same volume name."""
    _, path = _publish(rig)
    rebuilt = rig.plugin.construct_volume_spec("pv-a", os.path.dirname(path)).spec
    pv = rebuilt.persistent_volume
    assert pv.metadata.name == "pv-a"
    assert (pv.spec.csi.driver, pv.spec.csi.volume_handle) == (DRIVER_NAME, "h-1")
    assert pv.spec.volume_mode == "Filesystem"
    assert rig.plugin.get_volume_name(rebuilt) == f"{DRIVER_NAME}^h-1"


@pytest.mark.root
def test_construct_volume_spec_refuses_missing_and_corrupt_files(rig: Rig) -> None:
    """A missing vol_data.json, a corrupt one, or one lacking a key is a clear error naming
    the file, never a guess."""
    vol_dir = rig.root / "pods" / POD_UID / "volumes" / "kubernetes.io~csi" / "pv-x"
    vol_dir.mkdir(parents=True)
    with pytest.raises(VolumeDataMissingError, match=r"vol_data\.json.*does not exist"):
        rig.plugin.construct_volume_spec("pv-x", str(vol_dir))
    (vol_dir / "vol_data.json").write_text('{"specVolID": "pv-x", ')
    with pytest.raises(VolumeDataError, match="failed to parse volume data file"):
        rig.plugin.construct_volume_spec("pv-x", str(vol_dir))
    (vol_dir / "vol_data.json").write_text('["not", "an", "object"]')
    with pytest.raises(VolumeDataError, match="JSON object of strings"):
        rig.plugin.construct_volume_spec("pv-x", str(vol_dir))
    (vol_dir / "vol_data.json").write_text('{"specVolID": "pv-x", "driverName": "d"}')
    with pytest.raises(VolumeDataError, match="has no 'volumeHandle'"):
        rig.plugin.construct_volume_spec("pv-x", str(vol_dir))
    with pytest.raises(VolumeDataError):
        rig.plugin.new_unmounter("pv-missing", POD_UID)


@pytest.mark.root
def test_construct_block_volume_spec(rig: Rig) -> None:
    """A block volume is rebuilt from volumeDevices/<spec>/data/vol_data.json as a Block PV."""
    spec = pv_spec("pv-b", "blk-1", block=True, fs_type="")
    rig.plugin.new_block_volume_mapper(spec, make_pod(), VolumeOptions())
    rebuilt = rig.plugin.construct_block_volume_spec(POD_UID, "pv-b", "/ignored")
    pv = rebuilt.persistent_volume
    assert pv.spec.volume_mode == "Block" and pv.spec.csi.volume_handle == "blk-1"
    with pytest.raises(VolumeDataMissingError):
        rig.plugin.construct_block_volume_spec(POD_UID, "pv-none", "/ignored")


def test_vol_data_round_trip_escapes_like_go(tmp_path: os.PathLike[str]) -> None:
    """vol_data.json is written as Go's json.Encoder writes it (sorted, HTML-escaped, a final
    newline) and read back unchanged."""
    data = {"volumeHandle": "a<b>&c", "driverName": "d"}
    save_volume_data(str(tmp_path), data)
    with open(os.path.join(tmp_path, "vol_data.json")) as f:
        assert f.read() == '{"driverName":"d","volumeHandle":"a\\u003cb\\u003e\\u0026c"}\n'
    assert load_volume_data(str(tmp_path)) == data


def test_load_volume_data_reads_large_files_whole_and_refuses_bad_ones(
    tmp_path: os.PathLike[str],
) -> None:
    """A vol_data.json longer than one read comes back whole; bytes that are not UTF-8 and
    non-string values are clear errors naming the file."""
    path = os.path.join(tmp_path, "vol_data.json")
    big = {"driverName": "d", "note": "x" * 200_000}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(big, f)
    assert load_volume_data(str(tmp_path)) == big
    with open(path, "wb") as f:
        f.write(b'{"driverName": "\xff"}')
    with pytest.raises(VolumeDataError, match=r"failed to parse volume data file \[.*vol_data"):
        load_volume_data(str(tmp_path))
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"driverName": "d", "size": 3}')
    with pytest.raises(VolumeDataError, match="JSON object of strings"):
        load_volume_data(str(tmp_path))


@pytest.mark.root
def test_plugin_reads_a_spec_once_and_errors_are_not_remembered(rig: Rig) -> None:
    """The CSI source of a Spec is parsed once per Spec (the same object comes back); a Spec
    that is not CSI fails every time, and an inline volume is refused where a
    PersistentVolume is needed."""
    spec = pv_spec("pv-a", "h-1")
    first = rig.plugin.source(spec)
    assert rig.plugin.source(spec) is first
    assert rig.plugin.persistent_source(spec) is first
    assert (first.driver, first.volume_handle) == (DRIVER_NAME, "h-1")
    other = pv_spec("pv-a", "h-1")
    assert rig.plugin.source(other) is not first and rig.plugin.source(other) == first
    not_csi = Spec.from_volume(V1Volume(name="v", empty_dir=V1EmptyDirVolumeSource()))
    for _ in range(2):
        with pytest.raises(SpecError, match="not a CSI volume"):
            rig.plugin.source(not_csi)
    with pytest.raises(SpecError, match="inline CSI volume"):
        rig.plugin.persistent_source(inline_spec("inl"))


@pytest.mark.root
def test_unmount_device_without_vol_data_is_a_no_op(rig: Rig) -> None:
    """UnmountDevice on a path with no vol_data.json beside it succeeds without any call."""
    rig.plugin.new_detacher().unmount_device(str(rig.root / "nowhere" / "globalmount"))
    assert rig.driver.names() == []


@pytest.mark.root
def test_metrics_from_node_get_volume_stats(make_rig: RigFactory) -> None:
    """Metrics come from NodeGetVolumeStats on the pod's path; the volume condition is
    reported only when the driver advertises VOLUME_CONDITION."""
    rig = make_rig(node_caps={t.NodeCapability.STAGE_UNSTAGE_VOLUME,
                              t.NodeCapability.GET_VOLUME_STATS,
                              t.NodeCapability.VOLUME_CONDITION})
    rig.driver.condition = t.VolumeCondition(abnormal=True, message="disk on fire")
    _, path = _publish(rig)
    metrics = rig.plugin.new_unmounter("pv-a", POD_UID).get_metrics()
    st = os.statvfs(path)
    assert metrics.capacity == st.f_blocks * st.f_frsize
    assert metrics.inodes == st.f_files
    assert (metrics.abnormal, metrics.message) == (True, "disk on fire")
    assert rig.driver.requests("NodeGetVolumeStats")[0]["volume_path"] == path


@pytest.mark.root
def test_metrics_not_supported_without_get_volume_stats(make_rig: RigFactory) -> None:
    """A driver without GET_VOLUME_STATS gives a NOT_SUPPORTED MetricsError naming it."""
    rig = make_rig(node_caps={t.NodeCapability.STAGE_UNSTAGE_VOLUME})
    _publish(rig)
    with pytest.raises(MetricsError) as err:
        rig.plugin.new_unmounter("pv-a", POD_UID).get_metrics()
    assert err.value.code is MetricsErrorCode.NOT_SUPPORTED
    assert DRIVER_NAME in str(err.value)


@pytest.mark.root
def test_node_expand_and_controller_expand(
    make_rig: RigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NodeExpand sends the pod path, staging path and new size; without node EXPAND_VOLUME it
    is refused as not supported. Controller expansion uses ControllerExpandVolume."""
    # The driver's capabilities change in place below: every answer is taken as stale.
    monkeypatch.setattr("kubevol.plugins.csi.context.NODE_CAPABILITIES_MAX_AGE", -1.0)
    rig = make_rig(
        node_caps={t.NodeCapability.STAGE_UNSTAGE_VOLUME, t.NodeCapability.EXPAND_VOLUME},
        controller_caps={t.ControllerCapability.EXPAND_VOLUME},
    )
    dmp, path = _publish(rig)
    spec = pv_spec("pv-a", "h-1")
    assert rig.plugin.expand_volume_device(spec, 2 << 30, 1 << 30) == 2 << 30
    assert rig.driver.requests("ControllerExpandVolume")[0]["capacity_range"] == {
        "required_bytes": str(2 << 30)
    }
    options = NodeResizeOptions(volume_spec=spec, device_mount_path=path,
                                device_stage_path=dmp, new_size=2 << 30, old_size=1 << 30)
    assert rig.plugin.node_expand(options) is True
    call = rig.driver.requests("NodeExpandVolume")[0]
    assert (call["volume_path"], call["staging_target_path"]) == (path, dmp)
    rig.driver.node_caps = {t.NodeCapability.STAGE_UNSTAGE_VOLUME}
    with pytest.raises(OperationError, match="NodeExpand is not supported by the CSI driver"):
        rig.plugin.node_expand(options)


@pytest.mark.root
def test_volume_names_limits_and_republish(make_rig: RigFactory) -> None:
    """driver^handle names (inline volumes have none), attach limits per registered driver
    from NodeGetInfo, and requiresRepublish from the CSIDriver."""
    rig = make_rig(max_volumes=16, csi_drivers=LocalCSIDrivers(
        [{"metadata": {"name": DRIVER_NAME}, "spec": {"requiresRepublish": True}}]))
    spec = pv_spec("pv-a", "h-1")
    assert rig.plugin.get_volume_name(spec) == f"{DRIVER_NAME}^h-1"
    with pytest.raises(SpecError):
        rig.plugin.get_volume_name(inline_spec("scratch"))
    assert rig.plugin.get_volume_limits() == {f"attachable-volumes-csi-{DRIVER_NAME}": 16}
    assert rig.plugin.volume_limit_key(spec) == attach_limit_key(DRIVER_NAME)
    assert rig.plugin.requires_remount(spec) is True
    assert rig.plugin.can_support(spec) and rig.plugin.can_support(inline_spec("x"))
    long_key = attach_limit_key("x" * 60)
    assert len(long_key) < 63 and long_key.startswith("attachable-volumes-csi-" + "x" * 23)


@pytest.mark.root
def test_reconstructed_specs_carry_the_source_their_models_give(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spec rebuilt from vol_data.json (persistent, inline ephemeral, block) answers its
    CSI source, volume name and mounter path without building a model, and its source is the
    one read from the model built from the same data."""
    _, path = _publish(rig)
    eph = rig.root / "pods" / POD_UID / "volumes" / "kubernetes.io~csi" / "eph"
    eph.mkdir(parents=True)
    save_volume_data(str(eph), {"specVolID": "eph", "driverName": DRIVER_NAME,
                                "volumeHandle": "csi-x", "volumeLifecycleMode": "Ephemeral"})
    rig.plugin.new_block_volume_mapper(pv_spec("pv-b", "blk-1", block=True, fs_type=""),
                                       make_pod(), VolumeOptions())
    specs = [
        rig.plugin.construct_volume_spec("pv-a", os.path.dirname(path)).spec,
        rig.plugin.construct_volume_spec("eph", str(eph)).spec,
        rig.plugin.construct_block_volume_spec(POD_UID, "pv-b", "/ignored"),
    ]
    pod = DeferredApiObject("V1Pod", {"metadata": {"uid": POD_UID}})

    def refuse(type_name: str, data: object) -> None:
        raise AssertionError(f"a {type_name} model was built")

    for spec in specs:
        with monkeypatch.context() as m:
            m.setattr("kubevol.spec.api_object", refuse)
            known = rig.plugin.source(spec)
            if not known.ephemeral:
                assert rig.plugin.get_volume_name(spec) == f"{DRIVER_NAME}^{known.volume_handle}"
            if not known.block:
                rig.plugin.new_mounter(spec, pod, VolumeOptions()).get_path()
        built = (Spec.from_volume(spec.volume) if not spec.is_persistent_volume
                 else Spec.from_persistent_volume(spec.persistent_volume))
        assert known == csi_source(built)
    assert [s.name() for s in specs] == ["pv-a", "eph", "pv-b"]
    assert [rig.plugin.source(s).lifecycle_mode for s in specs] == [
        "Persistent", "Ephemeral", "Persistent"]
