"""Covers kubevol.node.poddirs.

A gone pod's directory is removed without following a link at the pod directory or at
one of its kind directories (issue 20, point 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubevol.node.poddirs import remove_pod_dir
from tests.hostile import snapshot


def victim(tmp_path: Path) -> Path:
    """A directory outside the root shaped like a pod directory, with empty kind dirs that
    a path-based removal would rmdir, and files it would delete."""
    out = tmp_path / "victim"
    for kind in ("volumes", "volumeDevices", "volume-subpaths"):
        (out / kind / "empty-plugin-dir").mkdir(parents=True)
    (out / "precious").write_text("keep")
    return out


@pytest.mark.parametrize("where", ["pod", "volumes"])
def test_a_link_in_a_pod_directory_is_refused_and_changes_nothing(
    tmp_path: Path, where: str
) -> None:
    """Refused (False), the link's target untouched, the link itself left for an operator."""
    target = victim(tmp_path)
    before = snapshot(target)
    pods = tmp_path / "root" / "pods"
    pod = pods / "uid-1"
    if where == "pod":
        pods.mkdir(parents=True)
        pod.symlink_to(target)
    else:
        pod.mkdir(parents=True)
        (pod / "volumes").symlink_to(target / "volumes")
    assert remove_pod_dir(str(pod)) is False
    assert snapshot(target) == before
    assert pod.exists() or pod.is_symlink()


def test_a_plain_gone_pod_directory_is_removed(tmp_path: Path) -> None:
    """Empty kind directories and leftovers go, as before."""
    pod = tmp_path / "root" / "pods" / "uid-1"
    (pod / "volumes" / "kubernetes.io~empty-dir").mkdir(parents=True)
    (pod / "etc-hosts").write_text("x")
    assert remove_pod_dir(str(pod)) is True
    assert not pod.exists()
