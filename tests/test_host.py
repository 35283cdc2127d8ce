"""Covers kubevol.node.host (not kubevol.host) and kubevol.layout's plugin-name escaping.

NodeVolumeHost: the kubelet's directory layout and its refusal of path traversal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubevol import InvalidPathSegmentError, NodeVolumeHost, escape_plugin_name
from kubevol.layout import unescape_plugin_name


def test_layout_matches_the_kubelet(host: NodeVolumeHost, node_root: Path) -> None:
    """Every directory sits where the kubelet puts it, plugin names escaped under pods/."""
    r = str(node_root)
    assert host.get_plugin_dir("kubernetes.io/csi") == f"{r}/plugins/kubernetes.io/csi"
    assert (
        host.get_volume_device_plugin_dir("kubernetes.io/csi")
        == f"{r}/plugins/kubernetes.io/csi/volumeDevices"
    )
    assert host.get_pods_dir() == f"{r}/pods"
    assert (
        host.get_pod_volume_dir("uid-1", "kubernetes.io/empty-dir", "cache")
        == f"{r}/pods/uid-1/volumes/kubernetes.io~empty-dir/cache"
    )
    assert (
        host.get_pod_plugin_dir("uid-1", "kubernetes.io/empty-dir")
        == f"{r}/pods/uid-1/plugins/kubernetes.io~empty-dir"
    )
    assert (
        host.get_pod_volume_device_dir("uid-1", "kubernetes.io/csi")
        == f"{r}/pods/uid-1/volumeDevices/kubernetes.io~csi"
    )
    assert host.get_plugins_registry_dir() == f"{r}/plugins_registry"
    assert host.get_node_name() == "node-1"


def test_plugin_name_escaping_round_trips() -> None:
    """'/' is escaped as '~' and back."""
    assert escape_plugin_name("kubernetes.io/csi") == "kubernetes.io~csi"
    assert unescape_plugin_name("kubernetes.io~csi") == "kubernetes.io/csi"


@pytest.mark.parametrize(
    "bad",
    ["", ".", "..", "../../etc", "a/b", "a\0b", "x" * 256, "/abs"],
)
def test_traversal_and_bad_segments_are_refused(
    host: NodeVolumeHost, node_root: Path, bad: str
) -> None:
    """Bad pod UIDs and volume names raise a clear error and create nothing."""
    with pytest.raises(InvalidPathSegmentError):
        host.get_pod_volume_dir(bad, "kubernetes.io/empty-dir", "v")
    with pytest.raises(InvalidPathSegmentError):
        host.get_pod_volume_dir("uid", "kubernetes.io/empty-dir", bad)
    assert list(node_root.iterdir()) == []


@pytest.mark.parametrize("bad_plugin", ["a/b/c", "../x", "kubernetes.io/..", "x\0"])
def test_bad_plugin_names_are_refused(host: NodeVolumeHost, bad_plugin: str) -> None:
    """Plugin names that would escape the plugins dir are refused."""
    with pytest.raises(InvalidPathSegmentError):
        host.get_plugin_dir(bad_plugin)


def test_error_names_what_was_wrong(host: NodeVolumeHost) -> None:
    """The message says which value failed and why."""
    with pytest.raises(InvalidPathSegmentError, match=r"pod UID '\.\.'"):
        host.get_pod_dir("..")
    with pytest.raises(InvalidPathSegmentError, match="at most 255"):
        host.get_pod_dir("u" * 300)
    assert isinstance(InvalidPathSegmentError("x"), ValueError)


def test_bad_node_name_is_refused(node_root: Path) -> None:
    """A node name is a path segment too (CSI ids embed it)."""
    with pytest.raises(InvalidPathSegmentError):
        NodeVolumeHost(root_dir=str(node_root), node_name="../n")


def test_segment_length_is_counted_in_utf8_bytes(host: NodeVolumeHost) -> None:
    """The 255-byte limit counts UTF-8 bytes, not characters: 100 three-byte characters are
    refused, 85 are accepted, and undecodable bytes (surrogate escapes) are counted too."""
    with pytest.raises(InvalidPathSegmentError, match="300 bytes long; at most 255"):
        host.get_pod_dir("€" * 100)
    assert host.get_pod_dir("€" * 85).endswith("/pods/" + "€" * 85)
    with pytest.raises(InvalidPathSegmentError, match="256 bytes long"):
        host.get_pod_dir("\udcff" * 256)


def test_paths_under_the_filesystem_root(tmp_path: Path) -> None:
    """A host rooted at '/' (or a root given with a trailing slash) lays paths out without a
    doubled slash."""
    assert NodeVolumeHost(root_dir="/", node_name="n").get_pods_dir() == "/pods"
    host = NodeVolumeHost(root_dir=f"{tmp_path}/", node_name="n")
    assert host.get_pod_volume_dir("u", "kubernetes.io/csi", "v") == (
        f"{tmp_path}/pods/u/volumes/kubernetes.io~csi/v"
    )
    assert host.get_plugin_dir("kubernetes.io/csi") == f"{tmp_path}/plugins/kubernetes.io/csi"
