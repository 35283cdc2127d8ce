"""kubevol.layout: every kubelet path built and described, path containment, durable atomic
writes. Expected paths are written out literally, as the kubelet lays them out."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from kubevol import layout
from kubevol.errors import InvalidPathSegmentError
from kubevol.layout import LayoutPath, PathRole, PodVolumeEntry

ROOT = "/var/lib/kubelet"
CSI = f"{ROOT}/plugins/kubernetes.io/csi"
HANDLE = "vol-1"
HASH = hashlib.sha256(HANDLE.encode()).hexdigest()


def test_node_wide_and_pod_paths_are_the_kubelets() -> None:
    """Plugin names nest under plugins/ and are escaped under pods/."""
    assert layout.plugin_dir(ROOT, "kubernetes.io/csi") == CSI
    assert layout.volume_device_plugin_dir(ROOT, "example.com/x") == (
        f"{ROOT}/plugins/example.com/x/volumeDevices"
    )
    assert layout.plugins_registry_dir(ROOT) == f"{ROOT}/plugins_registry"
    assert layout.pod_volume_dir(ROOT, "u1", "kubernetes.io/csi", "pv1") == (
        f"{ROOT}/pods/u1/volumes/kubernetes.io~csi/pv1"
    )
    assert layout.pod_volume_device_dir(ROOT, "u1", "kubernetes.io/csi") == (
        f"{ROOT}/pods/u1/volumeDevices/kubernetes.io~csi"
    )
    assert layout.pod_plugin_dir(ROOT, "u1", "kubernetes.io/empty-dir") == (
        f"{ROOT}/pods/u1/plugins/kubernetes.io~empty-dir"
    )
    assert layout.pod_subpath_dir(ROOT, "u1", "data", "app", 0) == (
        f"{ROOT}/pods/u1/volume-subpaths/data/app/0"
    )


def test_csi_paths_are_the_kubelets() -> None:
    """The CSI plugin's device mount is named by sha256(handle); block paths by spec name."""
    assert layout.csi_device_mount_path(CSI, "d.example.com", HANDLE) == (
        f"{CSI}/d.example.com/{HASH}/globalmount"
    )
    pod_vol = layout.pod_volume_dir(ROOT, "u1", "kubernetes.io/csi", "pv1")
    assert layout.csi_pod_mount_path(pod_vol) == f"{pod_vol}/mount"
    assert layout.csi_vol_data_path(pod_vol) == f"{pod_vol}/vol_data.json"
    block = f"{CSI}/volumeDevices"
    assert layout.csi_block_global_map_path(block, "pv-b") == f"{block}/pv-b/dev"
    assert layout.csi_block_data_dir(block, "pv-b") == f"{block}/pv-b/data"
    assert layout.csi_block_staging_path(block, "pv-b") == f"{block}/staging/pv-b"
    assert layout.csi_block_publish_path(block, "pv-b", "u1") == f"{block}/publish/pv-b/u1"
    with pytest.raises(ValueError, match="handle is empty"):
        layout.csi_device_mount_path(CSI, "d", "")


@pytest.mark.parametrize("bad", ["", "..", "a/b", "a\0b", "x" * 256])
def test_every_builder_refuses_a_bad_segment(bad: str) -> None:
    """Names that would leave the root are refused wherever they become a segment."""
    with pytest.raises(InvalidPathSegmentError):
        layout.pod_dir(ROOT, bad)
    with pytest.raises(InvalidPathSegmentError):
        layout.pod_volume_dir(ROOT, "u", "p/q", bad)
    with pytest.raises(InvalidPathSegmentError):
        layout.pod_subpath_dir(ROOT, "u", "v", bad, 0)
    with pytest.raises(InvalidPathSegmentError):
        layout.csi_device_mount_path(CSI, bad, HANDLE)
    with pytest.raises(InvalidPathSegmentError):
        layout.csi_block_publish_path(CSI, "pv", bad)


def _rel(path: str) -> str:
    return path[len(ROOT) + 1 :]


def test_describe_inverts_the_builders() -> None:
    """What is built is described back: role, plugin, volume, pod, and where the CSI
    vol_data.json that names the volume lies."""
    pod_vol = layout.pod_volume_dir(ROOT, "u1", "kubernetes.io/csi", "pv1")
    assert layout.describe(_rel(layout.csi_pod_mount_path(pod_vol))) == LayoutPath(
        role=PathRole.POD_VOLUME,
        plugin_name="kubernetes.io/csi",
        volume_name="pv1",
        pod_uid="u1",
        vol_data_dir="pods/u1/volumes/kubernetes.io~csi/pv1",
    )
    device = layout.csi_device_mount_path(CSI, "d.example.com", HANDLE)
    assert layout.describe(_rel(device)) == LayoutPath(
        role=PathRole.DEVICE_MOUNT,
        plugin_name="kubernetes.io/csi",
        volume_name=HASH,
        csi_driver="d.example.com",
        vol_data_dir=f"plugins/kubernetes.io/csi/d.example.com/{HASH}",
    )
    block = layout.volume_device_plugin_dir(ROOT, "kubernetes.io/csi")
    published = layout.describe(_rel(layout.csi_block_publish_path(block, "pv-b", "u2")))
    assert published == LayoutPath(
        role=PathRole.BLOCK,
        plugin_name="kubernetes.io/csi",
        volume_name="pv-b",
        pod_uid="u2",
        vol_data_dir="plugins/kubernetes.io/csi/volumeDevices/pv-b/data",
    )
    empty_dir = layout.pod_volume_dir(ROOT, "u1", "kubernetes.io/empty-dir", "cache")
    assert layout.describe(_rel(empty_dir)) == LayoutPath(
        role=PathRole.POD_VOLUME,
        plugin_name="kubernetes.io/empty-dir",
        volume_name="cache",
        pod_uid="u1",
    )
    subpath = layout.pod_subpath_dir(ROOT, "u1", "data", "app", 3)
    assert layout.describe(_rel(subpath)) == LayoutPath(
        role=PathRole.POD_SUBPATH, plugin_name=None, volume_name="data", pod_uid="u1"
    )


def test_describe_knows_the_older_and_in_tree_layouts() -> None:
    """CSI before 1.24 named device mounts by PV (no driver in the path); in-tree device
    mounts are named by their last segment; anything else is not the kubelet's."""
    legacy = layout.describe("plugins/kubernetes.io/csi/pv/pv-old/globalmount")
    assert legacy is not None and legacy.csi_driver is None
    assert legacy.volume_name == "pv-old"
    assert legacy.vol_data_dir == "plugins/kubernetes.io/csi/pv/pv-old"
    in_tree = layout.describe("plugins/kubernetes.io/rbd/mounts/pool-image/globalmount")
    assert in_tree == LayoutPath(
        role=PathRole.DEVICE_MOUNT, plugin_name="kubernetes.io/rbd", volume_name="pool-image"
    )
    for rel in ("plugins/kubernetes.io/csi", "pods/u1/volumes/x", "etc/passwd", ""):
        assert layout.describe(rel) is None


def test_pod_paths_split_and_plugin_dirs_are_named() -> None:
    """A path under pods/ splits into pod, kind and the rest; a path under plugins/ names
    the plugins whose directory could hold it and tells block layouts."""
    split = layout.split_pod_path("u1/volumes/kubernetes.io~csi/pv1/mount")
    assert split is not None and split.pod_uid == "u1" and split.kind == "volumes"
    assert split.rest == ("kubernetes.io~csi", "pv1", "mount")
    assert layout.split_pod_path("u1") is None
    assert layout.plugin_name_candidates(["example.com", "x", "m"]) == ["example.com/x",
                                                                        "example.com"]
    assert layout.block_segments(["kubernetes.io", "csi", "volumeDevices", "staging", "pv"]) == [
        "staging", "pv"
    ]
    assert layout.block_segments(["kubernetes.io", "csi", "d", HASH]) is None


def test_plugin_names_escape_round_trip_and_nest_at_most_once() -> None:
    """'/' is escaped as '~' under pods/ and back; a name nests at most one level."""
    assert layout.escape_plugin_name("kubernetes.io/csi") == "kubernetes.io~csi"
    assert layout.unescape_plugin_name("kubernetes.io~csi") == "kubernetes.io/csi"
    assert layout.plugin_name_segments("kubernetes.io/csi") == ["kubernetes.io", "csi"]
    with pytest.raises(InvalidPathSegmentError, match="more than one '/'"):
        layout.plugin_name_segments("a/b/c")


def test_csi_pod_volume_entries() -> None:
    """vol_data.json and a half-written copy are the CSI plugin's metadata, ``mount`` is its
    mount directory, anything else is pod data."""
    assert layout.csi_pod_volume_entry("vol_data.json") is PodVolumeEntry.METADATA
    assert layout.csi_pod_volume_entry(".vol_data.x1y2") is PodVolumeEntry.METADATA
    assert layout.csi_pod_volume_entry("mount") is PodVolumeEntry.MOUNT_DIR
    assert layout.csi_pod_volume_entry("data.db") is PodVolumeEntry.DATA


def test_containment_is_by_whole_segments() -> None:
    """A sibling sharing a prefix is not inside; equal is within but not below; '/' holds
    every absolute path."""
    assert layout.relative_to("/a/b/c", "/a/b") == "c"
    assert layout.relative_to("/a/b", "/a/b") == ""
    assert layout.relative_to("/a/bc", "/a/b") is None
    assert layout.relative_to("/a/b/c", "/a/b/") == "c"
    assert layout.is_within("/a/b", "/a/b") and not layout.is_below("/a/b", "/a/b")
    assert layout.is_below("/a/b/c", "/a/b") and not layout.is_within("/a/bc", "/a/b")
    assert layout.relative_to("/x/y", "/") == "x/y"


def test_atomic_write_replaces_with_the_mode_asked(tmp_path: Path) -> None:
    """The new content replaces the old in one rename, with the mode asked for, and no
    temporary file is left behind."""
    target = tmp_path / "state.json"
    target.write_text("old")
    written = layout.write_file_atomically(str(target), b"new", mode=0o644, temp_prefix=".t.")
    assert target.read_bytes() == b"new"
    assert (written.st_ino, written.st_size) == (os.stat(target).st_ino, 3)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    layout.write_json_atomically(str(target), {"b": 1, "a": [2]})
    assert target.read_text() == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    """When the rename fails (here: a directory is in the way) the error is raised, what was
    there is untouched and the temporary file is gone."""
    blocker = tmp_path / "state.json"
    blocker.mkdir()
    (blocker / "keep").write_text("x")
    with pytest.raises(OSError):
        layout.write_file_atomically(str(blocker), b"new")
    assert (blocker / "keep").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    with pytest.raises(TypeError):
        layout.write_json_atomically(str(tmp_path / "other.json"), {"x": object()})
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    with pytest.raises(FileNotFoundError):
        layout.write_file_atomically(str(tmp_path / "missing" / "f"), b"x")


def test_remove_files_tries_every_path_then_raises_the_first_error(tmp_path: Path) -> None:
    """Every file is removed, an absent one is fine, and a path that cannot be unlinked
    (a directory) raises only after all the others are gone."""
    paths = [tmp_path / f"{i}.json" for i in range(20)]
    for path in paths:
        path.write_text("x")
    (tmp_path / "dir").mkdir()
    todo = [str(p) for p in paths[:10]] + [str(tmp_path / "dir"), str(tmp_path / "absent")]
    with pytest.raises(IsADirectoryError):
        layout.remove_files(todo + [str(p) for p in paths[10:]])
    assert [p.name for p in tmp_path.iterdir()] == ["dir"]
    layout.remove_files([str(tmp_path / "absent")])


def test_write_files_atomically_writes_all_then_renames(tmp_path: Path) -> None:
    """Many files in two directories are written with their content and mode, no temporary
    file is left; when one cannot be written, none is replaced (every temporary file is
    written before the first rename) and the temporaries are gone."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "1").write_text("old")
    files = [(str(a / "1"), b"one"), (str(a / "2"), b"two"), (str(b / "3"), b"three")]
    stats = layout.write_files_atomically(files, mode=0o640)
    assert [(a / "1").read_text(), (a / "2").read_text(), (b / "3").read_text()] == [
        "one", "two", "three"
    ]
    assert [st.st_size for st in stats] == [3, 3, 5]
    assert stat.S_IMODE((b / "3").stat().st_mode) == 0o640
    assert sorted(p.name for p in a.iterdir()) == ["1", "2"]
    with pytest.raises(OSError):
        layout.write_files_atomically(
            [(str(a / "1"), b"new"), (str(tmp_path / "missing" / "x"), b"x")]
        )
    assert (a / "1").read_text() == "one"
    assert sorted(p.name for p in a.iterdir()) == ["1", "2"]
