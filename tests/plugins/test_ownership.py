"""Covers kubevol.plugins.ownership.

set_volume_ownership on real files.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest

from kubevol import FSGroupChangePolicy, set_volume_ownership
from kubevol.errors import UnsafePathError
from tests.hostile import LinkFlipper, snapshot

GROUP = 4321


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "vol"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "file").write_text("x")
    (root / "top").write_text("y")
    os.chmod(root / "top", 0o600)
    os.symlink("/etc/hostname", root / "link")
    return root


def test_none_fs_group_changes_nothing(tree: Path) -> None:
    """Without fsGroup nothing is touched."""
    before = os.stat(tree / "top")
    assert set_volume_ownership(str(tree), None) is False
    assert os.stat(tree / "top") == before


@pytest.mark.root
def test_always_sets_group_setgid_and_group_rw(tree: Path) -> None:
    """Every entry gets the group; dirs get setgid+group x; files get group rw."""
    assert set_volume_ownership(str(tree), GROUP, FSGroupChangePolicy.ALWAYS) is True
    for path in (tree, tree / "sub"):
        st = os.stat(path)
        assert st.st_gid == GROUP
        assert st.st_mode & stat.S_ISGID
        assert st.st_mode & 0o070 == 0o070
    st = os.stat(tree / "top")
    assert st.st_gid == GROUP
    assert st.st_mode & 0o060 == 0o060
    assert not st.st_mode & stat.S_ISGID
    assert os.stat(tree / "sub" / "file").st_gid == GROUP
    # The link is re-owned but its target is not followed.
    assert os.lstat(tree / "link").st_gid == GROUP
    assert os.stat("/etc/hostname").st_gid != GROUP


@pytest.mark.root
def test_read_only_grants_group_read_only(tree: Path) -> None:
    """A read-only volume gets group read, not write."""
    os.chmod(tree / "top", 0o400)
    set_volume_ownership(str(tree), GROUP, read_only=True)
    assert os.stat(tree / "top").st_mode & 0o070 == 0o040


@pytest.mark.root
def test_on_root_mismatch_skips_walk_when_root_matches(tree: Path) -> None:
    """OnRootMismatch skips the walk when the root already has the group and bits."""
    os.chown(tree, -1, GROUP)
    os.chmod(tree, 0o2770)
    assert set_volume_ownership(str(tree), GROUP, FSGroupChangePolicy.ON_ROOT_MISMATCH) is False
    assert os.stat(tree / "top").st_gid != GROUP
    os.chmod(tree, 0o755)  # mismatch now: the walk runs
    assert set_volume_ownership(str(tree), GROUP, FSGroupChangePolicy.ON_ROOT_MISMATCH) is True
    assert os.stat(tree / "top").st_gid == GROUP


def test_a_link_at_the_volume_directory_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    """The volume directory itself a link to a directory outside: UnsafePathError, the
    target keeps its group (issue 20, point 2)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    before = {p: os.lstat(p) for p in (outside, outside / "f")}
    link = tmp_path / "vol"
    link.symlink_to(outside)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        set_volume_ownership(str(link), GROUP)
    assert {p: os.lstat(p) for p in before} == before


def test_racing_symlink_swaps_never_reown_files_outside(tmp_path: Path) -> None:
    """A workload flipping sub-directories between directory and link to a directory
    outside while the walk runs: nothing outside changes group or mode (issue 20, point 1)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for i in range(10):
        (outside / f"f{i}").write_text("x")
        os.chmod(outside / f"f{i}", 0o600)
    before = snapshot(outside)
    for attempt in range(3):
        vol = tmp_path / f"vol-{attempt}"
        names = [f"d{d}" for d in range(30)]
        for name in names:
            (vol / name).mkdir(parents=True)
            for f in range(10):  # the target's names: re-owned through a link if followed
                (vol / name / f"f{f}").write_text("y")
        # The tree changing under the walk is fine: what matters is outside.
        with LinkFlipper(vol, outside, names), contextlib.suppress(OSError):
            set_volume_ownership(str(vol), GROUP)
        assert snapshot(outside) == before, f"attempt {attempt} re-owned files outside"
