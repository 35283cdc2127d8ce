"""Covers kubevol.cli.down with the ownership model of kubevol.node.owners.

``kubevol down`` obeys the ownership model: it tears down exactly the pods it is given,
never a pod it has no record of and that is not named, nor a recorded pod not named."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.testing.mount_rig import mounts_under, unmount_all_under

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

UIDS = {name: f"0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i, name in enumerate("abc")}


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A kubelet root; whatever a failing test leaves mounted under tmp_path is unmounted."""
    if os.geteuid() != 0:
        pytest.fail("needs root (real mounts)")
    try:
        yield tmp_path / "root"
    finally:
        unmount_all_under(tmp_path)


def _manifest(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {UIDS[name]}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes: [{{name: cache, emptyDir: {{medium: Memory}}}}]
""")
    return path


def test_down_takes_only_the_named_pod_not_recorded_or_unknown_ones(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pods a, b, c are up; c's record is then lost (a pod of another owner, found on disk
    only). ``down a`` takes a away; b (recorded, not named) and c (no record, not named)
    keep their mount, their data and their directories."""
    flags = ["--root", str(root), "--node-name", "n1"]
    manifests = {name: _manifest(tmp_path, name) for name in UIDS}
    assert main(["up", *flags, *map(str, manifests.values())]) == 0
    data = {}
    for name, uid in UIDS.items():
        cache = root / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / "cache"
        (cache / "f").write_text(name)
        data[name] = cache
    os.unlink(root / "kubevol" / "pods" / f"{UIDS['c']}.json")
    others = [p for p in mounts_under(root) if f"/{UIDS['a']}/" not in p]
    assert len(others) == 2
    capsys.readouterr()
    assert main(["down", *flags, str(manifests["a"])]) == 0
    assert capsys.readouterr().out.strip() == f"{UIDS['a']}: gone"
    assert mounts_under(root) == others
    assert not (root / "pods" / UIDS["a"]).exists()
    for name in "bc":
        assert (data[name] / "f").read_text() == name
    assert sorted(os.listdir(root / "kubevol" / "pods")) == [f"{UIDS['b']}.json"]
    # Named, the pod without a record goes too (the operator vouches for it).
    assert main(["down", *flags, "--pod-uid", UIDS["c"]]) == 0
    assert [p for p in mounts_under(root) if f"/{UIDS['c']}/" in p] == []
    assert (data["b"] / "f").read_text() == "b"
