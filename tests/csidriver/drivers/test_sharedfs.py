"""Covers kubevol.csidriver.drivers.sharedfs.

The sharedfs driver: where its volumes live (parameters and volume contexts in kubevol's,
csi-driver-nfs's and Azure Lustre's spellings, with csi-driver-nfs's templates), and what its
calls do on a real GlusterFS: sub-directories made, deleted, kept or archived, capacity from
statfs, static volumes staged from their context alone, nothing deleted that is not its own."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.drivers.sharedfs import (
    Filesystem,
    LocationError,
    OnDelete,
    SharedFSConfig,
    SharedFSDriver,
    location_of,
)
from kubevol.csidriver.drivers.sharedfs.location import check_option
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.testing.glusterfs import GlusterServer
from kubevol.testing.mount_rig import mounts_under

MULTI = t.VolumeCapability.mount(t.AccessMode.MULTI_NODE_MULTI_WRITER)
DEFAULT = Filesystem(source="gluster1:/vol", fstype="glusterfs")


# --- where volumes live ---------------------------------------------------------------


def test_kubevol_parameters_with_csi_driver_nfs_templates() -> None:
    """source/fstype/mountOptions name the filesystem; subDir's templates are filled from
    the external-provisioner's metadata parameters; onDelete is read case-insensitively."""
    loc = location_of(
        {
            "source": "nfs1:/export", "fstype": "nfs4", "mountOptions": "vers=4.1, hard",
            "subDir": "${pvc.metadata.namespace}/${pvc.metadata.name}-${pv.metadata.name}",
            "csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "shop",
            "csi.storage.k8s.io/pv/name": "pvc-123", "onDelete": "Archive",
        },
        name="pvc-123",
    )  # fmt: skip
    assert loc.filesystem == Filesystem(
        source="nfs1:/export", fstype="nfs4", mount_options=("vers=4.1", "hard")
    )
    assert (loc.sub_dir, loc.on_delete, loc.static) == ("shop/data-pvc-123", OnDelete.ARCHIVE,
                                                       False)
    assert loc.context() == {"source": "nfs1:/export", "fstype": "nfs4",
                             "mountOptions": "vers=4.1,hard", "subDir": "shop/data-pvc-123"}


def test_azure_lustre_and_csi_driver_nfs_spellings() -> None:
    """An Azure Lustre volume context (mgs-ip-address, fs-name, sub-dir) is a lustre mount of
    MGS@tcp:/FSNAME; csi-driver-nfs's server/share an nfs mount of server:share; without a
    sub-directory a static volume is the whole filesystem, a created one its name."""
    lustre = location_of({"mgs-ip-address": "10.0.0.4", "fs-name": "lustrefs",
                          "sub-dir": "team/a"})
    assert lustre.filesystem == Filesystem(source="10.0.0.4@tcp:/lustrefs", fstype="lustre")
    assert lustre.sub_dir == "team/a"
    assert location_of({"mgs-ip-address": "10.0.0.4", "fs-name": "fs"}).sub_dir == ""
    nfs = location_of({"server": "nfs-server.default", "share": "/exports"}, name="pvc-1")
    assert nfs.filesystem == Filesystem(source="nfs-server.default:/exports", fstype="nfs")
    assert nfs.sub_dir == "pvc-1"
    assert location_of({}, name="pvc-2", default=DEFAULT).filesystem == DEFAULT


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({}, "no filesystem named"),
        ({"source": "gluster1:/vol"}, "needs an fstype"),
        ({"source": "-oremount", "fstype": "nfs"}, "not a filesystem source"),
        ({"source": "a:/b", "fstype": "nfs; rm"}, "not a filesystem type"),
        ({"source": "a:/b", "fstype": "nfs", "mountOptions": "bind"}, "not allowed"),
        ({"source": "a:/b", "fstype": "nfs", "subDir": "../etc"}, "leaves the filesystem"),
        ({"source": "a:/b", "fstype": "nfs", "subDir": "${pvc.metadata.name}"},
         "--extra-create-metadata"),
        ({"source": "a:/b", "fstype": "nfs", "subDir": "${pod.metadata.name}"},
         "unknown template"),
        ({"source": "a:/b", "fstype": "nfs", "onDelete": "shred"}, "is not one of"),
        ({"mgs-ip-address": "10.0.0.4"}, "go together"),
    ],
)
def test_bad_locations_are_refused_with_the_reason(values: dict[str, str], problem: str) -> None:
    """What does not name a filesystem and a sub-directory inside it is refused, saying why."""
    with pytest.raises(LocationError, match=problem.replace("(", r"\(")):
        location_of(values, name="pvc-1")


def test_options_that_bind_or_inject_are_refused() -> None:
    """A mount option cannot bind, move or remount, nor smuggle a comma or a new argument."""
    for option in ("rbind", "remount", "ro,bind", "a b", "-t"):
        with pytest.raises(LocationError):
            check_option(option)
    check_option("vers=4.1")


def test_config_needs_source_and_fstype_together(tmp_path: Path) -> None:
    """A default filesystem needs both its source and its type."""
    with pytest.raises(ValueError, match="go together"):
        SharedFSConfig(state_dir=str(tmp_path), source="a:/b")


# --- on a real GlusterFS --------------------------------------------------------------


@pytest.fixture
def sharedfs(tmp_path: Path, glusterfs: GlusterServer) -> Iterator[CSIClient]:
    """The driver on the test's GlusterFS (its default filesystem), served; afterwards
    nothing of it is left mounted."""
    config = SharedFSConfig(state_dir=str(tmp_path / "state"), node_id="node-1",
                            source=glusterfs.source, fstype="glusterfs", timeout=5)
    try:
        with SharedFSDriver(config).serve() as running, CSIClient(running.endpoint) as client:
            yield client
    finally:
        assert mounts_under(tmp_path / "state") == []
        assert mounts_under(tmp_path / "node") == []


@pytest.mark.root
def test_create_is_idempotent_and_a_taken_sub_directory_already_exists(
    sharedfs: CSIClient, glusterfs: GlusterServer
) -> None:
    """CreateVolume makes the sub-directory (0777) and answers the same volume when
    repeated; another name resolving to the same sub-directory is ALREADY_EXISTS."""
    params = {"subDir": "shared/one"}
    first = sharedfs.create_volume("v1", [MULTI], parameters=params)
    assert sharedfs.create_volume("v1", [MULTI], parameters=params) == first
    made = glusterfs.brick / "shared" / "one"
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o777
    with pytest.raises(CSIRPCError) as err:
        sharedfs.create_volume("v2", [MULTI], parameters=params)
    assert err.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert made.is_dir()  # the refused creation undid nothing of v1's
    with pytest.raises(CSIRPCError) as err:
        sharedfs.create_volume("v3", [MULTI], parameters={"subDir": "../up"})
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.root
@pytest.mark.parametrize("policy", ["delete", "retain", "archive"])
def test_delete_volume_follows_on_delete(
    sharedfs: CSIClient, glusterfs: GlusterServer, policy: str
) -> None:
    """DeleteVolume deletes the sub-directory and its files, keeps it, or renames it to
    archived-NAME, as ``onDelete`` says; repeating it is OK."""
    vol = sharedfs.create_volume("pvc-x", [MULTI], parameters={"onDelete": policy})
    (glusterfs.brick / "pvc-x" / "data").write_text("kept?")
    sharedfs.delete_volume(vol.volume_id)
    sharedfs.delete_volume(vol.volume_id)
    names = set(os.listdir(glusterfs.brick)) - {".glusterfs"}
    expected = {"delete": set(), "retain": {"pvc-x"}, "archive": {"archived-pvc-x"}}[policy]
    assert names == expected
    if policy == "archive":
        assert (glusterfs.brick / "archived-pvc-x" / "data").read_text() == "kept?"


@pytest.mark.root
def test_capacity_is_the_filesystems_free_space(
    sharedfs: CSIClient, glusterfs: GlusterServer
) -> None:
    """GetCapacity reports what statfs of the Gluster volume says is free (its brick is a
    256 MiB tmpfs), not a made-up total."""
    free = sharedfs.get_capacity().available_capacity
    brick = os.statvfs(glusterfs.brick)
    assert 0 < free <= brick.f_blocks * brick.f_frsize
    assert abs(free - brick.f_bavail * brick.f_frsize) < 8 << 20


@pytest.mark.root
def test_static_volume_is_staged_from_its_context_and_never_deleted(
    sharedfs: CSIClient, glusterfs: GlusterServer, tmp_path: Path
) -> None:
    """A volume the driver never created (a hand-written PV) is staged and published from
    its volume context alone, read-only when asked; after NodeUnstage the driver forgets it,
    and the data stays on the filesystem."""
    (glusterfs.brick / "static" / "dir").mkdir(parents=True)
    (glusterfs.brick / "static" / "dir" / "f").write_text("hand-made")
    context = {"source": glusterfs.source, "fstype": "glusterfs", "subDir": "static/dir"}
    staging, target = tmp_path / "node" / "staging", tmp_path / "node" / "target"
    staging.mkdir(parents=True)
    with pytest.raises(CSIRPCError) as err:
        sharedfs.node_stage_volume("handle-1", str(staging), MULTI)
    assert err.value.code is grpc.StatusCode.NOT_FOUND
    sharedfs.node_stage_volume("handle-1", str(staging), MULTI, volume_context=context)
    sharedfs.node_publish_volume("handle-1", str(target), MULTI,
                                 staging_target_path=str(staging), readonly=True)
    assert (target / "f").read_text() == "hand-made"
    with pytest.raises(OSError):
        (target / "g").write_text("no")
    entry = next(e for e in parse_mountinfo() if e.mount_point == str(target))
    assert entry.root == "/static/dir" and "ro" in entry.options
    assert [e.volume.volume_id for e in sharedfs.list_volumes().entries] == ["handle-1"]
    sharedfs.node_unpublish_volume("handle-1", str(target))
    sharedfs.node_unstage_volume("handle-1", str(staging))
    assert sharedfs.list_volumes().entries == ()
    assert not target.exists() and staging.is_dir()
    assert (glusterfs.brick / "static" / "dir" / "f").read_text() == "hand-made"


@pytest.mark.root
def test_a_foreign_mount_at_the_staging_path_is_refused_and_left(
    sharedfs: CSIClient, tmp_path: Path
) -> None:
    """A staging path someone else mounted is not adopted: FAILED_PRECONDITION, and the
    mount stays."""
    vol = sharedfs.create_volume("pvc-f", [MULTI])
    staging = tmp_path / "node" / "staging"
    staging.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "foreign", str(staging)], check=True)
    try:
        with pytest.raises(CSIRPCError) as err:
            sharedfs.node_stage_volume(vol.volume_id, str(staging), MULTI,
                                       volume_context=vol.volume_context)
        assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
        assert mounts_under(staging) == [str(staging)]
    finally:
        subprocess.run(["umount", str(staging)], check=True)
