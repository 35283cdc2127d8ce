"""Each pattern of the kubelet-in-a-box suite fails a hostpath driver with one node
behaviour broken on purpose, naming the problem; the sound driver passes every check."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.engine import EngineNode, Publication, Staging, VolumeRecord
from kubevol.csidriver.drivers.engine.records import AccessKind
from kubevol.csidriver.drivers.hostpath import loop
from kubevol.csidriver.drivers.hostpath.backend import (
    HostPathBackend,
    bind_options,
    bound_device,
)
from kubevol.testing.e2e import CHECKS, Status
from tests.csidriver.e2e.drivers import failed, hostpath, run

pytestmark = pytest.mark.root


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail("the e2e suite needs root (real mounts)")
    return tmp_path


serving = contextlib.contextmanager(hostpath)


def test_the_sound_hostpath_driver_passes_every_check(tmp: Path) -> None:
    """Every check, driver restarts included, passes against the bundled hostpath driver,
    well within the two minutes issue 33 allows."""
    start = time.monotonic()
    with serving(tmp) as driver:
        outcomes = run(driver, tmp, "", restart=True)
    assert {o.status for o in outcomes.values()} == {Status.PASSED}, (
        tmp / "report.txt").read_text()
    assert set(outcomes) == {c.name for c in CHECKS}
    assert time.monotonic() - start < 120


# -- volumes / volume_io / subpath: a NodePublish that mounts nothing ---------------------------


class MountsNothingBackend(HostPathBackend):
    """NodePublish creates the target directory and answers OK, mounting nothing."""

    def publish(self, volume: VolumeRecord, publication: Publication, staging: Staging | None,
                *, repeat: bool) -> None:
        if volume.kind is AccessKind.BLOCK:
            super().publish(volume, publication, staging, repeat=repeat)
            return
        os.makedirs(publication.target_path, exist_ok=True)

    def unpublish(self, volume: VolumeRecord, publication: Publication) -> None:
        if volume.kind is AccessKind.BLOCK:
            super().unpublish(volume, publication)
            return
        shutil.rmtree(publication.target_path, ignore_errors=True)


def test_a_publish_that_mounts_nothing_fails_volumes_and_subpath(tmp: Path) -> None:
    """volumes/store-data and the subpath checks fail a NodePublish that mounts nothing,
    saying nothing is mounted at the target or that the data did not reach the volume."""
    with serving(tmp, backend=MountsNothingBackend) as driver:
        outcomes = run(driver, tmp, "store-data or various or subpath")
    assert failed(outcomes) == {"volumes/store-data", "volume_io/various-sizes",
                                "subpath/directory", "subpath/file"}
    assert "nothing is mounted at" in outcomes["volumes/store-data"].reason
    assert "NodePublishVolume" in outcomes["volumes/store-data"].reason
    assert any(c.method == "NodePublishVolume" for c in outcomes["volumes/store-data"].calls)


class IgnoresFlagsBackend(HostPathBackend):
    """NodeStage and NodePublish bind without the capability's mount flags."""

    def stage(self, volume: VolumeRecord, staging: Staging, *, repeat: bool) -> Staging:
        if volume.kind is AccessKind.MOUNT and not repeat:
            self.mounter.mount(self.volume_path(volume), staging.path, "", ["bind"])
            return staging
        return super().stage(volume, staging, repeat=repeat)

    def bind_at_target(self, source: str, publication: Publication, kind: AccessKind, *,
                       repeat: bool) -> None:
        if kind is AccessKind.MOUNT and not repeat:
            os.makedirs(publication.target_path, exist_ok=True)
            ro = ["ro"] if publication.readonly else []
            self.mounter.mount(source, publication.target_path, "", ["bind", *ro])
            return
        super().bind_at_target(source, publication, kind, repeat=repeat)


def test_a_driver_ignoring_mount_flags_fails_mount_options(tmp: Path) -> None:
    """volumes/mount-options fails a driver that drops the PV's mountOptions."""
    with serving(tmp, backend=IgnoresFlagsBackend) as driver:
        outcomes = run(driver, tmp, "mount-options or store-data")
    assert failed(outcomes) == {"volumes/mount-options"}
    assert "lacks mount options ['nodev', 'noexec']" in outcomes["volumes/mount-options"].reason


class IgnoresReadonlyBackend(HostPathBackend):
    """NodePublish binds read-write whatever readonly says."""

    def bind_at_target(self, source: str, publication: Publication, kind: AccessKind, *,
                       repeat: bool) -> None:
        if kind is AccessKind.MOUNT and not repeat:
            os.makedirs(publication.target_path, exist_ok=True)
            self.mounter.mount(source, publication.target_path, "",
                               bind_options(publication, False))
            return
        super().bind_at_target(source, publication, kind, repeat=repeat)


def test_a_driver_ignoring_readonly_fails_the_read_only_claim(tmp: Path) -> None:
    """volumes/read-only-claim fails a NodePublish that ignores readonly."""
    with serving(tmp, backend=IgnoresReadonlyBackend) as driver:
        outcomes = run(driver, tmp, "read-only")
    assert failed(outcomes) == {"volumes/read-only-claim"}
    assert "could write" in outcomes["volumes/read-only-claim"].reason


class ZeroStatsNode(EngineNode):
    """NodeGetVolumeStats reports nothing used."""

    def node_get_volume_stats(self, request: Any, context: Any) -> Any:
        response = super().node_get_volume_stats(request, context)
        for usage in response.usage:
            usage.used = 0
        return response


def test_stats_that_miss_the_usage_fail(tmp: Path) -> None:
    """volumes/stats fails a driver whose NodeGetVolumeStats reports nothing used."""
    with serving(tmp, node=ZeroStatsNode) as driver:
        outcomes = run(driver, tmp, "stats")
    assert failed(outcomes) == {"volumes/stats"}
    assert "reported 0 bytes used" in outcomes["volumes/stats"].reason


# -- multivolume: a NodePublish that publishes a private copy -----------------------------------


class PrivateCopyBackend(HostPathBackend):
    """NodePublish binds a copy of the volume made for that target, not the volume."""

    def bind_at_target(self, source: str, publication: Publication, kind: AccessKind, *,
                       repeat: bool) -> None:
        if kind is AccessKind.MOUNT and not repeat:
            copy = os.path.join(self.root, "copies", publication.target_path.replace("/", "_"))
            shutil.copytree(source, copy, dirs_exist_ok=True)
            os.makedirs(publication.target_path, exist_ok=True)
            self.mounter.mount(copy, publication.target_path, "", ["bind"])
            return
        super().bind_at_target(source, publication, kind, repeat=repeat)

    def _target_source(self, volume: VolumeRecord, publication: Publication) -> str:
        if volume.kind is AccessKind.MOUNT:
            return os.path.join(self.root, "copies", publication.target_path.replace("/", "_"))
        return super()._target_source(volume, publication)


def test_a_publish_of_a_private_copy_fails_multivolume(tmp: Path) -> None:
    """multivolume/one-volume-two-pods fails a driver whose pods do not share the volume;
    two-volumes-one-pod fails it too (the data does not survive the pod)."""
    with serving(tmp, backend=PrivateCopyBackend) as driver:
        outcomes = run(driver, tmp, "multivolume")
    assert failed(outcomes) == {"multivolume/one-volume-two-pods",
                                "multivolume/two-volumes-one-pod"}
    reason = outcomes["multivolume/one-volume-two-pods"].reason
    assert "the second pod, while the first runs" in reason


# -- volumemode: a block NodePublish that copies the device ------------------------------------


class CopiesDeviceBackend(HostPathBackend):
    """A block NodePublish copies the device's content into a loop device of its own."""

    def bind_at_target(self, source: str, publication: Publication, kind: AccessKind, *,
                       repeat: bool) -> None:
        if kind is AccessKind.BLOCK and not repeat:
            image = os.path.join(self.root, "copy-" + publication.target_path.replace("/", "_"))
            shutil.copyfile(source, image)
            source = loop.attach(image)
        super().bind_at_target(source, publication, kind, repeat=repeat)

    def unpublish(self, volume: VolumeRecord, publication: Publication) -> None:
        if volume.kind is not AccessKind.BLOCK:
            super().unpublish(volume, publication)
            return
        device = bound_device(publication.target_path, self.mounter.table())
        self.mounter.unmount(publication.target_path)
        os.unlink(publication.target_path)
        if device:
            loop.detach(device)


def test_a_block_publish_that_copies_the_device_fails_volumemode(tmp: Path) -> None:
    """volumemode/block-io fails a driver whose block NodePublish binds a copy."""
    with serving(tmp, backend=CopiesDeviceBackend) as driver:
        outcomes = run(driver, tmp, "block-io")
    assert failed(outcomes) == {"volumemode/block-io"}
    assert "not a copy of it" in outcomes["volumemode/block-io"].why


# -- volume_expand: a NodeExpand that does not grow anything ------------------------------------


class NoGrowBackend(HostPathBackend):
    """NodeExpandVolume answers the new size without refreshing the loop device."""

    def node_expand(self, volume: VolumeRecord, path: str) -> int:
        return volume.capacity_bytes


def test_a_node_expand_that_does_not_grow_fails_volume_expand(tmp: Path) -> None:
    """volume_expand/online-block fails a NodeExpand that leaves the device's size."""
    with serving(tmp, backend=NoGrowBackend) as driver:
        outcomes = run(driver, tmp, "volume_expand")
    assert failed(outcomes) == {"volume_expand/online-block"}
    assert "bytes after expansion to" in outcomes["volume_expand/online-block"].reason


# -- disruptive ---------------------------------------------------------------------------------


class NotIdempotentNode(EngineNode):
    """NodeUnpublishVolume answers NOT_FOUND for a target that is not published."""

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        vol = self.engine.volume(request.volume_id)
        if vol is None or request.target_path not in vol.publications:
            raise CSIRPCError(grpc.StatusCode.NOT_FOUND, "not published there")
        return super().node_unpublish_volume(request, context)


def test_a_not_idempotent_unpublish_fails_disruptive(tmp: Path) -> None:
    """disruptive/unpublish-repeated-after-crash fails a NodeUnpublish that is not
    idempotent, and the report shows the driver's NOT_FOUND."""
    with serving(tmp, node=NotIdempotentNode) as driver:
        outcomes = run(driver, tmp, "disruptive and not block")
    assert failed(outcomes) == {"disruptive/unpublish-repeated-after-crash"}
    outcome = outcomes["disruptive/unpublish-repeated-after-crash"]
    assert "already unpublished was answered NOT_FOUND" in outcome.reason
    assert any(c.code == "NOT_FOUND" for c in outcome.calls)


def test_a_driver_that_forgets_node_state_fails_the_driver_restart(tmp: Path) -> None:
    """disruptive/driver-restart fails a driver that loses where it published on restart
    (its NodeUnpublish then answers OK and leaves the mount)."""
    with serving(tmp, forgets=True) as driver:
        outcomes = run(driver, tmp, "driver-restart or kubelet-restart-filesystem",
                       restart=True)
    assert failed(outcomes) == {"disruptive/driver-restart"}
    assert "left the target mounted" in outcomes["disruptive/driver-restart"].reason


def test_the_driver_restart_is_skipped_without_a_way_to_restart(tmp: Path) -> None:
    """Without --driver-command the driver restart check is skipped, saying why."""
    with serving(tmp) as driver:
        outcomes = run(driver, tmp, "driver-restart")
    outcome = outcomes["disruptive/driver-restart"]
    assert outcome.status is Status.SKIPPED and "--driver-command" in outcome.reason
