"""Covers kubevol.node.sizes.

The sizes kubevol remembers for the volumes on a root (what the kubelet keeps in the
claim's status.capacity): written and read back, and hostile files under the root taken as
no figure at all, never followed, never waited on."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kubevol.layout import sha256_hex
from kubevol.node.sizes import VolumeSizes

NAME = "kubernetes.io/csi/hostpath.csi.kubevol.io^vol-1"


def test_a_size_is_kept_read_back_and_forgotten(tmp_path: Path) -> None:
    """set, get and forget round-trip; the directory is 0700 and the file 0600 and names
    the volume; an unknown volume has no size."""
    sizes = VolumeSizes(str(tmp_path))
    assert sizes.get(NAME) is None
    sizes.set(NAME, 32 << 20)
    assert sizes.get(NAME) == 32 << 20
    assert VolumeSizes(str(tmp_path)).get(NAME) == 32 << 20  # a restarted process
    path = tmp_path / "kubevol" / "volume-sizes" / f"{sha256_hex(NAME)}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sizes.get(NAME + "-other") is None
    sizes.forget(NAME)
    assert sizes.get(NAME) is None
    sizes.forget(NAME)  # idempotent


def test_hostile_files_count_as_no_size(tmp_path: Path) -> None:
    """A record of another volume, a size that is not a non-negative integer, garbage, a
    link to a right record and a FIFO (opened without waiting) all read as None."""
    sizes = VolumeSizes(str(tmp_path))
    sizes.set("other", 5)
    path = Path(sizes.dir) / f"{sha256_hex(NAME)}.json"
    other = Path(sizes.dir) / f"{sha256_hex('other')}.json"
    for text in (
        other.read_text(),
        f'{{"volume": "{NAME}", "size": -1}}',
        f'{{"volume": "{NAME}", "size": true}}',
        f'{{"volume": "{NAME}", "size": "5"}}',
        "[1, 2]",
        "not json",
    ):
        path.write_text(text)
        assert sizes.get(NAME) is None, text
    path.unlink()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(f'{{"volume": "{NAME}", "size": 5}}')
    path.symlink_to(elsewhere)  # what it says is right, but a link is not followed
    assert sizes.get(NAME) is None
    path.unlink()
    os.mkfifo(path)
    assert sizes.get(NAME) is None
