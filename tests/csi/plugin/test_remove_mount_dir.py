"""remove_mount_dir: the kubelet's removeMountDir, on real directories and a real mount."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kubevol.csi.plugin import remove_mount_dir
from kubevol.node.host import NodeVolumeHost


def test_removes_mount_dir_vol_data_and_interrupted_write_leftovers(
    host: NodeVolumeHost, tmp_path: Path
) -> None:
    """An unmounted pod volume dir goes, with vol_data.json and a killed writer's temp file."""
    volume_dir = tmp_path / "pods/uid/volumes/kubernetes.io~csi/pv"
    (volume_dir / "mount").mkdir(parents=True)
    (volume_dir / "vol_data.json").write_text("{}\n")
    (volume_dir / ".vol_data.abc123").write_text('{"half')
    remove_mount_dir(host, str(volume_dir / "mount"))
    assert not volume_dir.exists()


def test_leaves_a_mounted_path_and_its_metadata(host: NodeVolumeHost, tmp_path: Path) -> None:
    """A path that is still mounted keeps everything, vol_data.json included."""
    volume_dir = tmp_path / "pv"
    (volume_dir / "mount").mkdir(parents=True)
    (volume_dir / "vol_data.json").write_text("{}\n")
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(volume_dir / "mount")], check=True)
    try:
        remove_mount_dir(host, str(volume_dir / "mount"))
        assert (volume_dir / "vol_data.json").is_file()
    finally:
        subprocess.run(["umount", str(volume_dir / "mount")], check=True)
