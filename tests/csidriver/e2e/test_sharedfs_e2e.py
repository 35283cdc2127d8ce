"""Covers kubevol.testing.e2e against kubevol.csidriver.drivers.sharedfs.

The kubelet-in-a-box suite against the bundled sharedfs driver on a real GlusterFS (issue
33: it passes against kubevol's bundled drivers): every filesystem check passes, and the
block checks are skipped with the driver's own refusal (sharedfs serves no block volumes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.csidriver.drivers.sharedfs import SharedFSConfig, SharedFSDriver
from kubevol.testing.glusterfs import GlusterServer

pytestmark = pytest.mark.root


def test_sharedfs_on_glusterfs_passes_every_filesystem_check(
    tmp_path: Path, glusterfs: GlusterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() != 0:
        pytest.fail("the e2e suite needs root (real mounts)")
    config = SharedFSConfig(state_dir=str(tmp_path / "state"), source=glusterfs.source,
                            fstype="glusterfs")
    with SharedFSDriver(config).serve() as running:
        code = main(["driver", "e2e", "--endpoint", running.endpoint,
                     "--csi.testvolumesize", "16Mi"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 failed" in out, out
    for check in ("volumes/store-data", "multivolume/one-volume-two-pods",
                  "volume_expand/online-filesystem", "subpath/file",
                  "disruptive/deleted-while-down-filesystem"):
        assert f"PASSED  {check}" in out, out
    assert "SKIPPED volumemode/block-io" in out and "block access is not supported" in out
