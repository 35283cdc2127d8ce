"""Covers kubevol.csidriver.drivers.hostpath and kubevol.csidriver.drivers.mock.

The hostpath driver (and the mock's real-path mode) acts only on what its state says it
made: foreign mounts, existing targets, the root directory and ids edited in its state file
are refused, and nothing of theirs is unmounted or deleted (issue 20, point 3)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.hostpath.state import SqliteStore
from kubevol.mount.mountinfo import parse_mountinfo
from tests.csidriver.drivers.conftest import HostPathFactory, Served, target_path

MiB = 1 << 20
MOUNT = t.VolumeCapability.mount()
BLOCK = t.VolumeCapability.block()
SIZE = t.CapacityRange(required_bytes=64 * MiB)

StagingDir = Callable[[str], str]


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``call`` fails with."""
    with pytest.raises(CSIRPCError) as info:
        call()
    return info.value.code


def mounts_at(path: str) -> list[str]:
    """The filesystem types mounted at ``path``, bottom first."""
    return [e.fs_type for e in parse_mountinfo() if e.mount_point == path]


@pytest.fixture
def foreign_tmpfs() -> Iterator[Callable[[str], None]]:
    """Mount a tmpfs (someone else's mount) at a path; unmounted after the test."""
    made: list[str] = []

    def mount(path: str) -> None:
        subprocess.run(["mount", "-t", "tmpfs", "foreign", path], check=True)
        made.append(path)

    yield mount
    for path in reversed(made):
        subprocess.run(["umount", path], capture_output=True, check=False)


@pytest.mark.root
def test_stage_refuses_a_path_that_is_already_a_mount_point(
    hostpath: Served, staging_dir: StagingDir, foreign_tmpfs: Callable[[str], None]
) -> None:
    """NodeStage on a foreign mount point is FAILED_PRECONDITION (it used to mount nothing
    and answer OK), and NodeUnstage afterwards leaves the foreign mount alone (it used to
    unmount it)."""
    c = hostpath.client
    staging = staging_dir("foreign")
    foreign_tmpfs(staging)
    Path(staging, "theirs").write_text("keep")
    vid = c.create_volume("v", [MOUNT], capacity_range=SIZE).volume_id
    assert code_of(lambda: c.node_stage_volume(vid, staging, MOUNT)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    c.node_unstage_volume(vid, staging)
    assert mounts_at(staging) == ["tmpfs"]
    assert Path(staging, "theirs").read_text() == "keep"
    c.delete_volume(vid)


@pytest.mark.root
def test_unstage_leaves_a_mount_stacked_over_the_drivers(
    hostpath: Served, staging_dir: StagingDir, foreign_tmpfs: Callable[[str], None]
) -> None:
    """A foreign mount made over the driver's staging bind is not unmounted by NodeUnstage
    (FAILED_PRECONDITION); once it is gone, NodeUnstage removes the driver's own bind."""
    c = hostpath.client
    staging = staging_dir("stacked")
    vid = c.create_volume("v", [MOUNT], capacity_range=SIZE).volume_id
    c.node_stage_volume(vid, staging, MOUNT)
    foreign_tmpfs(staging)
    assert code_of(lambda: c.node_unstage_volume(vid, staging)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    assert mounts_at(staging)[-1] == "tmpfs"
    subprocess.run(["umount", staging], check=True)
    c.node_unstage_volume(vid, staging)
    assert mounts_at(staging) == []
    c.delete_volume(vid)


def test_root_and_links_to_it_are_refused_as_staging_paths(
    hostpath: Served, tmp_path: Path
) -> None:
    """Staging at ``/`` is INVALID_ARGUMENT, at a symbolic link to ``/`` FAILED_PRECONDITION;
    publishing at ``/`` is INVALID_ARGUMENT: the host's root is never mounted over or bound
    out."""
    c = hostpath.client
    before = len(parse_mountinfo())
    vid = c.create_volume("v", [MOUNT], capacity_range=SIZE).volume_id
    for root in ("/", "//", "/tmp/.."):
        assert code_of(lambda r=root: c.node_stage_volume(vid, r, MOUNT)) == (  # type: ignore[misc]
            grpc.StatusCode.INVALID_ARGUMENT
        )
    link = tmp_path / "to-root"
    link.symlink_to("/")
    assert code_of(lambda: c.node_stage_volume(vid, str(link), MOUNT)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    assert code_of(lambda: c.node_publish_volume(vid, "/", MOUNT, staging_target_path="/")) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert len(parse_mountinfo()) == before
    c.delete_volume(vid)


@pytest.mark.root
@pytest.mark.parametrize("cap", [MOUNT, BLOCK], ids=["mount", "block"])
def test_publish_refuses_an_existing_target_and_unpublish_keeps_it(
    hostpath: Served, tmp_path: Path, staging_dir: StagingDir, cap: t.VolumeCapability
) -> None:
    """A target that exists before NodePublish (a file for block, a directory for mount)
    was not made by the driver: publishing there is FAILED_PRECONDITION and NodeUnpublish
    does not delete it (a block publish used to bind over the file, and unpublish deleted
    it)."""
    c = hostpath.client
    staging = staging_dir("s")
    vid = c.create_volume("v", [cap], capacity_range=SIZE).volume_id
    c.node_stage_volume(vid, staging, cap)
    target = target_path(tmp_path, "existing")
    if cap is BLOCK:
        Path(target).write_text("precious")
    else:
        os.mkdir(target)
        Path(target, "precious").write_text("precious")
    assert code_of(
        lambda: c.node_publish_volume(vid, target, cap, staging_target_path=staging)
    ) == (grpc.StatusCode.FAILED_PRECONDITION)
    c.node_unpublish_volume(vid, target)
    assert mounts_at(target) == []
    kept = Path(target) if cap is BLOCK else Path(target, "precious")
    assert kept.read_text() == "precious"
    # A fresh target works, and a repeat of it is the driver's own.
    fresh = target_path(tmp_path, "fresh")
    for _ in range(2):
        c.node_publish_volume(vid, fresh, cap, staging_target_path=staging)
    c.node_unpublish_volume(vid, fresh)
    assert not os.path.lexists(fresh)
    c.node_unstage_volume(vid, staging)
    c.delete_volume(vid)


def test_mock_refuses_an_existing_target_and_keeps_it(
    mock_factory: Callable[..., Served], tmp_path: Path
) -> None:
    """The mock's real-path mode follows the same rule: an existing file at a block target
    is refused and survives NodeUnpublish."""
    caps = {t.ControllerCapability.CREATE_DELETE_VOLUME}
    c = mock_factory(controller_caps=frozenset(caps), mock_mount=True).client
    staging = tmp_path / "staging"
    staging.mkdir()
    vid = c.create_volume("v", [BLOCK]).volume_id
    c.node_stage_volume(vid, str(staging), BLOCK)
    target = target_path(tmp_path, "dev")
    Path(target).write_text("precious")
    assert code_of(
        lambda: c.node_publish_volume(vid, target, BLOCK, staging_target_path=str(staging))
    ) == (grpc.StatusCode.FAILED_PRECONDITION)
    c.node_unpublish_volume(vid, target)
    assert Path(target).read_text() == "precious"


def test_an_edited_volume_id_cannot_make_delete_remove_outside_the_state_dir(
    hostpath_factory: HostPathFactory, tmp_path: Path
) -> None:
    """A volume id edited in the state file to climb out of the state directory makes
    DeleteVolume refuse (INTERNAL) instead of removing the directory it names."""
    served = hostpath_factory()
    vid = served.client.create_volume("v", [MOUNT], capacity_range=SIZE).volume_id
    served.stop()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data").write_text("keep")
    store = SqliteStore(served.config.state_dir)
    state = store.load()
    evil = "../../victim"
    state.volumes[evil] = attrs.evolve(state.volumes.pop(vid), volume_id=evil)
    store.save(state)
    store.close()
    c = hostpath_factory().client
    assert code_of(lambda: c.delete_volume(evil)) == grpc.StatusCode.INTERNAL
    assert (victim / "data").read_text() == "keep"
