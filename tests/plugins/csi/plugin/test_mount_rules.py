"""Covers kubevol.plugins.csi.rules, kubevol.plugins.csi.source and kubevol.plugins.csi.mounter.

The kubelet's rules the CSI plugin follows: ephemeral volumes, pod information, fsGroup,
access modes, SELinux-free defaults, and which errors are transient, uncertain or final."""

from __future__ import annotations

import json
import os
from typing import Any

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError, CSIRPCUncertainError
from kubevol.errors import (
    OperationError,
    TransientOperationError,
    UncertainProgressError,
    is_operation_finished,
)
from kubevol.plugins.csi import csi_access_mode, ephemeral_volume_handle
from kubevol.plugins.csi.driverinfo import LocalCSIDrivers
from kubevol.testing.mount_rig import mounts_under
from kubevol.types import DeviceMounterArgs, MounterArgs, VolumeOptions
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME, tree
from tests.plugins.csi.plugin.rig import POD_UID, Rig, RigFactory, inline_spec, make_pod, pv_spec


def _drivers(**spec: Any) -> LocalCSIDrivers:
    return LocalCSIDrivers([{"kind": "CSIDriver", "metadata": {"name": DRIVER_NAME}, "spec": spec}])


@pytest.mark.root
def test_ephemeral_inline_volume_lifecycle(make_rig: RigFactory) -> None:
    """An inline volume gets handle csi-<sha256(podUID+name)>, pod information when the
    CSIDriver asks for it, no staging, vol_data.json marked Ephemeral; it is rebuilt from disk
    as an inline csi volume and torn down to nothing."""
    drivers = _drivers(volumeLifecycleModes=["Ephemeral"], podInfoOnMount=True,
                       attachRequired=False)
    rig = make_rig(csi_drivers=drivers)
    spec = inline_spec("scratch", attributes={"size": "1Mi"})
    assert not rig.plugin.can_attach(spec) and not rig.plugin.can_device_mount(spec)
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    handle = ephemeral_volume_handle(POD_UID, "scratch")
    publish = rig.driver.requests("NodePublishVolume")[0]
    assert publish["volume_id"] == handle
    assert "staging_target_path" not in publish
    assert publish["volume_context"] == {
        "size": "1Mi",
        "csi.storage.k8s.io/pod.name": "web-0",
        "csi.storage.k8s.io/pod.namespace": "shop",
        "csi.storage.k8s.io/pod.uid": POD_UID,
        "csi.storage.k8s.io/serviceAccount.name": "builder",
        "csi.storage.k8s.io/ephemeral": "true",
    }
    vol_dir = os.path.dirname(mounter.get_path())
    with open(os.path.join(vol_dir, "vol_data.json")) as f:
        assert json.load(f)["volumeLifecycleMode"] == "Ephemeral"
    rebuilt = rig.plugin.construct_volume_spec("scratch", vol_dir).spec
    assert rebuilt.volume is not None and rebuilt.volume.csi.driver == DRIVER_NAME
    assert rebuilt.name() == "scratch"
    rig.plugin.new_unmounter("scratch", POD_UID).tear_down()
    assert mounts_under(rig.root) == []
    assert not os.path.exists(vol_dir)


@pytest.mark.root
@pytest.mark.parametrize(
    ("drivers", "why"),
    [
        (None, "(no CSIDriver object)"),
        (_drivers(volumeLifecycleModes=["Persistent"]), "(only supports ['Persistent'])"),
    ],
)
def test_ephemeral_volume_refused_without_the_lifecycle_mode(
    make_rig: RigFactory, drivers: LocalCSIDrivers | None, why: str
) -> None:
    """Ephemeral volumes need a CSIDriver listing Ephemeral: otherwise set-up is transient and
    nothing is created on disk or sent to the driver."""
    rig = make_rig(csi_drivers=drivers) if drivers is not None else make_rig()
    mounter = rig.plugin.new_mounter(inline_spec("scratch"), make_pod(), VolumeOptions())
    with pytest.raises(TransientOperationError, match=r'volume mode "Ephemeral" not supported'):
        mounter.set_up(MounterArgs())
    with pytest.raises(TransientOperationError) as err:
        mounter.set_up(MounterArgs())
    assert why in str(err.value)
    assert tree(rig.root) == []
    assert rig.driver.names() == []


@pytest.mark.root
def test_pod_info_only_when_csidriver_asks(rig: Rig) -> None:
    """Without podInfoOnMount the volume context is exactly the PV's attributes."""
    spec = pv_spec("pv-a", "h-1", attributes={"k": "v"})
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    rig.plugin.new_mounter(spec, make_pod(), VolumeOptions()).set_up(MounterArgs())
    assert rig.driver.requests("NodePublishVolume")[0]["volume_context"] == {"k": "v"}
    assert rig.driver.requests("NodeStageVolume")[0]["volume_context"] == {"k": "v"}


def _publish(rig: Rig, spec: Any, fs_group: int | None) -> str:
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs(fs_group=fs_group))
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs(fs_group=fs_group))
    return mounter.get_path()


@pytest.mark.root
@pytest.mark.parametrize(
    ("policy", "fs_type", "modes", "applied"),
    [
        (None, "ext4", ("ReadWriteOnce",), True),  # no CSIDriver: ReadWriteOnceWithFSType
        (None, "", ("ReadWriteOnce",), False),  # ... which needs an fsType
        (None, "ext4", ("ReadOnlyMany",), False),  # ... and ReadWriteOnce
        ("File", "", ("ReadOnlyMany",), True),  # File: always
        ("None", "ext4", ("ReadWriteOnce",), False),  # None: never
    ],
)
def test_fs_group_applied_by_the_kubelet_per_policy(
    make_rig: RigFactory, policy: str | None, fs_type: str, modes: tuple[str, ...], applied: bool
) -> None:
    """Without VOLUME_MOUNT_GROUP the plugin changes group ownership itself exactly when the
    fsGroup policy says so."""
    rig = make_rig(csi_drivers=_drivers(fsGroupPolicy=policy) if policy else None)
    path = _publish(rig, pv_spec("pv-a", "h-1", fs_type=fs_type, access_modes=modes), 4321)
    assert (os.stat(path).st_gid == 4321) is applied


@pytest.mark.root
def test_volume_mount_group_delegates_fs_group_to_the_driver(make_rig: RigFactory) -> None:
    """A driver with VOLUME_MOUNT_GROUP receives the fsGroup in NodeStage and NodePublish and
    the plugin leaves ownership alone."""
    rig = make_rig(node_caps={t.NodeCapability.STAGE_UNSTAGE_VOLUME,
                              t.NodeCapability.VOLUME_MOUNT_GROUP})
    path = _publish(rig, pv_spec("pv-a", "h-1"), 4321)
    assert rig.driver.requests("NodeStageVolume")[0]["volume_capability"]["mount"][
        "volume_mount_group"] == "4321"
    assert rig.driver.requests("NodePublishVolume")[0]["volume_capability"]["mount"][
        "volume_mount_group"] == "4321"
    assert os.stat(path).st_gid != 4321


@pytest.mark.root
def test_csidriver_without_fs_group_policy_is_transient(make_rig: RigFactory) -> None:
    """A CSIDriver object carrying no fsGroupPolicy (an API server always sets one) makes
    set-up fail transiently, as the kubelet does."""
    rig = make_rig(csi_drivers=lambda name: {"metadata": {"name": name}, "spec": {}})
    mounter = rig.plugin.new_mounter(pv_spec("pv-a", "h-1"), make_pod(), VolumeOptions())
    with pytest.raises(TransientOperationError, match="expected valid fsGroupPolicy"):
        mounter.set_up(MounterArgs())


@pytest.mark.parametrize(
    ("mode", "plain", "snmw"),
    [
        ("ReadWriteOnce", "SINGLE_NODE_WRITER", "SINGLE_NODE_MULTI_WRITER"),
        ("ReadOnlyMany", "MULTI_NODE_READER_ONLY", "MULTI_NODE_READER_ONLY"),
        ("ReadWriteMany", "MULTI_NODE_MULTI_WRITER", "MULTI_NODE_MULTI_WRITER"),
        ("ReadWriteOncePod", "SINGLE_NODE_WRITER", "SINGLE_NODE_SINGLE_WRITER"),
        ("Bogus", "UNKNOWN", "UNKNOWN"),
    ],
)
def test_access_mode_mapping(mode: str, plain: str, snmw: str) -> None:
    """Kubernetes access modes map to CSI ones as the kubelet maps them, with and without the
    driver's SINGLE_NODE_MULTI_WRITER capability."""
    assert csi_access_mode(mode, single_node_multi_writer=False).name == plain
    assert csi_access_mode(mode, single_node_multi_writer=True).name == snmw


@pytest.mark.root
def test_single_node_multi_writer_driver_gets_snmw_modes(make_rig: RigFactory) -> None:
    """Against a driver advertising SINGLE_NODE_MULTI_WRITER, a ReadWriteOncePod PV is staged
    and published as SINGLE_NODE_SINGLE_WRITER."""
    rig = make_rig(node_caps={t.NodeCapability.STAGE_UNSTAGE_VOLUME,
                              t.NodeCapability.SINGLE_NODE_MULTI_WRITER})
    _publish(rig, pv_spec("pv-a", "h-1", access_modes=("ReadWriteOncePod",)), None)
    for rpc in ("NodeStageVolume", "NodePublishVolume"):
        mode = rig.driver.requests(rpc)[0]["volume_capability"]["access_mode"]["mode"]
        assert mode == "SINGLE_NODE_SINGLE_WRITER"


@pytest.mark.root
def test_final_publish_error_removes_what_set_up_created(rig: Rig) -> None:
    """A final NodePublish failure (INVALID_ARGUMENT) is final and removes the pod volume
    directory and its vol_data.json."""
    rig.driver.fail["NodePublishVolume"] = (grpc.StatusCode.INVALID_ARGUMENT, "bad")
    spec = pv_spec("pv-a", "h-1")
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    with pytest.raises(CSIRPCError) as err:
        mounter.set_up(MounterArgs())
    assert is_operation_finished(err.value)
    assert not os.path.exists(os.path.dirname(mounter.get_path()))


@pytest.mark.root
def test_uncertain_publish_error_keeps_vol_data_for_teardown(rig: Rig) -> None:
    """A non-final NodePublish failure (UNAVAILABLE) is uncertain and keeps vol_data.json, so
    the volume can be torn down later."""
    rig.driver.fail["NodePublishVolume"] = (grpc.StatusCode.UNAVAILABLE, "busy")
    mounter = rig.plugin.new_mounter(pv_spec("pv-a", "h-1"), make_pod(), VolumeOptions())
    with pytest.raises(CSIRPCUncertainError) as err:
        mounter.set_up(MounterArgs())
    assert isinstance(err.value, UncertainProgressError)
    assert os.path.exists(os.path.join(os.path.dirname(mounter.get_path()), "vol_data.json"))
    rig.plugin.new_unmounter("pv-a", POD_UID).tear_down()
    assert not os.path.exists(os.path.dirname(mounter.get_path()))


@pytest.mark.root
@pytest.mark.parametrize(
    ("code", "kept"), [(grpc.StatusCode.INTERNAL, False), (grpc.StatusCode.ABORTED, True)]
)
def test_stage_error_cleans_up_only_when_final(
    rig: Rig, code: grpc.StatusCode, kept: bool
) -> None:
    """A final NodeStage failure removes globalmount and vol_data.json; a non-final one
    (ABORTED) is uncertain and keeps them."""
    rig.driver.fail["NodeStageVolume"] = (code, "nope")
    spec = pv_spec("pv-a", "h-1")
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    with pytest.raises(CSIRPCError) as err:
        attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    assert isinstance(err.value, UncertainProgressError) is kept
    assert os.path.exists(os.path.join(os.path.dirname(dmp), "vol_data.json")) is kept


@pytest.mark.root
def test_unregistered_driver_is_transient_everywhere(make_rig: RigFactory) -> None:
    """Until the driver registers, stage, publish, unstage and unpublish fail transiently
    (kubernetes#120268) without touching the disk."""
    rig = make_rig(register=False)
    spec = pv_spec("pv-a", "h-1")
    attacher = rig.plugin.new_attacher()
    dmp = attacher.get_device_mount_path(spec)
    with pytest.raises(TransientOperationError, match="not found in the list of registered"):
        attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    with pytest.raises(TransientOperationError):
        rig.plugin.new_mounter(spec, make_pod(), VolumeOptions()).set_up(MounterArgs())
    assert tree(rig.root) == []
    # With the kubelet's files present (a restart before the driver came back):
    rig.registry.register_driver(DRIVER_NAME, rig.handle.address, ["1.0.0"])
    attacher.mount_device(spec, "", dmp, DeviceMounterArgs())
    mounter = rig.plugin.new_mounter(spec, make_pod(), VolumeOptions())
    mounter.set_up(MounterArgs())
    rig.registry.deregister_driver(DRIVER_NAME)
    with pytest.raises(TransientOperationError):
        rig.plugin.new_unmounter("pv-a", POD_UID).tear_down()
    rig.registry.register_driver(DRIVER_NAME, rig.handle.address, ["1.0.0"])
    rig.plugin.new_unmounter("pv-a", POD_UID).tear_down()
    rig.registry.deregister_driver(DRIVER_NAME)
    with pytest.raises(TransientOperationError):
        attacher.unmount_device(dmp)
    assert dmp in mounts_under(rig.root)


@pytest.mark.root
def test_unpublish_failure_is_final_and_keeps_files(rig: Rig) -> None:
    """A failed NodeUnpublish is a final error that leaves the mount and vol_data.json."""
    spec = pv_spec("pv-a", "h-1")
    path = _publish(rig, spec, None)
    rig.driver.fail["NodeUnpublishVolume"] = (grpc.StatusCode.INTERNAL, "stuck")
    with pytest.raises(OperationError, match=r"Unmounter\.TearDownAt failed"):
        rig.plugin.new_unmounter("pv-a", POD_UID).tear_down()
    assert path in mounts_under(rig.root)
    assert os.path.exists(os.path.join(os.path.dirname(path), "vol_data.json"))
