"""Covers kubevol.cli.driver serving kubevol.csidriver.drivers.sharedfs.

``kubevol driver serve sharedfs``: its --help, its usage errors, and a real driver process
on a real GlusterFS that keeps its staged volume across a restart."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csidriver.drivers.sharedfs import DRIVER_NAME
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.testing.glusterfs import GlusterServer
from tests.cli.test_driver_cli import DriverProcess

KUBEVOL = [sys.executable, "-m", "kubevol.cli.main"]


@pytest.fixture
def processes() -> Iterator[list[DriverProcess]]:
    """Driver processes started by a test; all stopped (by PID) at the end."""
    started: list[DriverProcess] = []
    yield started
    for proc in started:
        proc.stop()


def test_help_names_the_parameters_and_flags() -> None:
    """--help describes the parameters a StorageClass gives and every flag, with gocsi's
    environment after them."""
    out = subprocess.run([*KUBEVOL, "driver", "serve", "sharedfs", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for text in ("subDir", "${pvc.metadata.name}", "mgs-ip-address", "onDelete", "--source",
                 "--fstype", "--mount-options", "--on-delete", "--timeout", "--share-client",
                 "X_CSI_DEBUG"):
        assert text in out, text


def test_source_without_fstype_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--source without --fstype exits with the usage code and says why."""
    code = main(["driver", "serve", "sharedfs", "--state-dir", str(tmp_path / "s"),
                 "--source", "gluster1:/vol", "--endpoint", f"unix://{tmp_path}/x.sock"])
    assert code == exits.USAGE
    assert "source and fstype go together" in capsys.readouterr().err


@pytest.mark.root
def test_served_driver_keeps_its_staged_volume_across_a_restart(
    processes: list[DriverProcess], tmp_path: Path, glusterfs: GlusterServer
) -> None:
    """The driver process on GlusterFS creates and stages a volume; restarted on the same
    --state-dir it still knows it (staged, mounted) and tears it down."""
    state, sock = tmp_path / "state", tmp_path / "sfs.sock"
    args = ["sharedfs", "--state-dir", str(state), "--node-id", "n1",
            "--source", glusterfs.source, "--fstype", "glusterfs", "--timeout", "5"]
    first = DriverProcess(args, sock)
    processes.append(first)
    staging = tmp_path / "staging"
    staging.mkdir()
    cap = t.VolumeCapability.mount(t.AccessMode.MULTI_NODE_MULTI_WRITER)
    with first.client() as client:
        assert client.get_plugin_info().name == DRIVER_NAME
        vol = client.create_volume("kept", [cap])
        client.node_stage_volume(vol.volume_id, str(staging), cap,
                                 volume_context=vol.volume_context)
    assert first.stop()[0] == 0
    assert any(e.mount_point == str(staging) for e in parse_mountinfo())
    second = DriverProcess(args, sock)
    processes.append(second)
    with second.client() as client:
        assert [e.volume.volume_id for e in client.list_volumes().entries] == [vol.volume_id]
        client.node_unstage_volume(vol.volume_id, str(staging))
        client.delete_volume(vol.volume_id)
    assert not any(e.mount_point == str(staging) for e in parse_mountinfo())
    assert not (glusterfs.brick / "kept").exists()
