"""Covers kubevol.plugins.csi.rules: remove_mount_dir.

remove_mount_dir: the kubelet's removeMountDir, on real directories and a real mount.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kubevol.errors import UnsafePathError
from kubevol.node.host import NodeVolumeHost
from kubevol.plugins.csi import remove_mount_dir


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


@pytest.mark.root
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


@pytest.mark.parametrize("link_at", ["volume", "pod"])
def test_a_link_at_the_volume_or_pod_directory_changes_nothing_where_it_points(
    host: NodeVolumeHost, node_root: Path, tmp_path: Path, link_at: str
) -> None:
    """A link put at a CSI pod volume directory (or at the pod directory) pointing at a
    directory shaped like a volume outside the root: the removal is refused naming the link,
    and the target keeps its vol_data.json, its temporary file and its empty ``mount``."""
    victim = tmp_path / "victim"
    (victim / "mount").mkdir(parents=True)
    (victim / "vol_data.json").write_text("{}\n")
    (victim / ".vol_data.abc123").write_text("keep")
    kind_dir = node_root / "pods/uid/volumes/kubernetes.io~csi"
    if link_at == "volume":
        kind_dir.mkdir(parents=True)
        (kind_dir / "pv").symlink_to(victim)
    else:
        (victim / "volumes/kubernetes.io~csi/pv/mount").mkdir(parents=True)
        (node_root / "pods").mkdir()
        (node_root / "pods/uid").symlink_to(victim)
        victim = victim / "volumes/kubernetes.io~csi/pv"
        (victim / "vol_data.json").write_text("{}\n")
        (victim / ".vol_data.abc123").write_text("keep")
    with pytest.raises(UnsafePathError, match="link"):
        remove_mount_dir(host, str(kind_dir / "pv" / "mount"))
    assert sorted(p.name for p in victim.iterdir()) == [".vol_data.abc123", "mount",
                                                         "vol_data.json"]
