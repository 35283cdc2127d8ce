"""Covers kubevol.csidriver.drivers.sharedfs under kubevol.csidriver.sanity.

The sharedfs driver passes the conformance suite on a real GlusterFS, with 0 failures,
whether the filesystem comes from the driver's defaults or from CreateVolume parameters; and
leaves nothing mounted and no volume directory behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubevol.csidriver.drivers.sharedfs import SharedFSConfig, SharedFSDriver
from kubevol.testing.glusterfs import GlusterServer
from tests.csidriver.sanity.suite import run_suite
from tests.csidriver.sanity.test_bundled_drivers import no_mounts_under

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

#: Tests sharedfs's capabilities skip, and only those: no snapshots, group snapshots or
#: clones, no ControllerModifyVolume, no ControllerPublish (nothing to attach).
SHAREDFS_SKIPS = frozenset(
    {
        "test_clone_volume",
        "test_controller_modify_volume",
        "test_create_volume_with_volume_attributes_class",
        "test_controller_publish_incompatible_is_already_exists",
        "test_controller_publish_is_idempotent",
        "test_controller_publish_requires_fields",
        "test_controller_publish_respects_the_node_attach_limit",
        "test_controller_publish_unknown_volume_or_node",
        "test_controller_volume_lifecycle",
        "test_create_from_unknown_source_is_not_found",
        "test_same_name_other_source_already_exists",
        "test_volume_from_snapshot",
        "test_create_snapshot_is_idempotent",
        "test_create_snapshot_requires_fields",
        "test_delete_snapshot",
        "test_get_snapshot",
        "test_list_snapshots_entries_and_deletion",
        "test_list_snapshots_filters",
        "test_list_snapshots_pages",
        "test_snapshot_ids_are_unique",
        "test_group_capabilities_are_known",
        "test_group_snapshot_lifecycle",
        "test_group_snapshot_required_fields_and_unknown_ids",
    }
)


@pytest.mark.parametrize("where", ["driver-default", "parameters"])
def test_sharedfs_passes_on_glusterfs(
    tmp_path: Path, glusterfs: GlusterServer, where: str
) -> None:
    """Every test of the suite that sharedfs's capabilities allow passes on GlusterFS (10 GiB
    nominal volumes on a 256 MiB brick); afterwards nothing of the driver is mounted and the
    volume directories it made are gone from the brick."""
    params = tmp_path / "params.yaml"
    params.write_text(f"source: '{glusterfs.source}'\nfstype: glusterfs\nonDelete: delete\n")
    defaults = {"source": glusterfs.source, "fstype": "glusterfs"}
    config = SharedFSConfig(
        state_dir=str(tmp_path / "state"),
        node_id="node-1",
        **(defaults if where == "driver-default" else {}),  # type: ignore[arg-type]
    )
    before = set(os.listdir(glusterfs.brick))
    with SharedFSDriver(config).serve() as running:
        options = ["--csi-params-file", str(params)] if where == "parameters" else []
        result = run_suite(running.endpoint, tmp_path / "suite", *options)
    assert result.exit_code == 0 and not result.failed, result.describe()
    assert result.skipped <= SHAREDFS_SKIPS, result.describe()
    assert len(result.passed) >= 32, result.describe()
    assert no_mounts_under(tmp_path / "suite") and no_mounts_under(tmp_path / "state")
    assert set(os.listdir(glusterfs.brick)) == before
