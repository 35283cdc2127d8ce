"""Covers kubevol.nomad.claims and kubevol.nomad.types.

Usage options, volume capabilities and the usage tracker's logic and persistence.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from kubevol.csi import types as t
from kubevol.nomad import (
    AccessMode,
    AttachmentMode,
    CSIVolume,
    ManagerStateError,
    MountOptions,
    UsageOptions,
    UsageTracker,
    VolumeKey,
)

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

KEY = VolumeKey(namespace="default", volume_id="vol", usage="rw-file-system-single-node-writer")


@pytest.mark.parametrize(
    ("read_only", "attachment", "access"),
    list(itertools.product([False, True], AttachmentMode, AccessMode)),
)
def test_to_fs_is_a_safe_segment_that_parses_back(
    read_only: bool, attachment: AttachmentMode, access: AccessMode
) -> None:
    """Every usage names a directory ro|rw-<attachment>-<access> of letters and dashes,
    which from_fs reads back to the same usage."""
    usage = UsageOptions(read_only=read_only, attachment_mode=attachment, access_mode=access)
    name = usage.to_fs()
    assert name == f"{'ro' if read_only else 'rw'}-{attachment.value}-{access.value}"
    assert re.fullmatch(r"[a-z][a-z-]*", name)
    assert UsageOptions.from_fs(name) == usage


@pytest.mark.parametrize("bad", ["", "rw", "xx-file-system-single-node-writer", "rw-disk-x"])
def test_from_fs_refuses_other_names(bad: str) -> None:
    """Names that are not usage directories raise ValueError naming them."""
    with pytest.raises(ValueError, match="is not a volume usage directory name"):
        UsageOptions.from_fs(bad)


def test_mount_options_do_not_change_the_usage_name() -> None:
    """Mount options stay out of to_fs (and so out of the tracker key): an unmount without
    them finds the claim made with them."""
    with_opts = UsageOptions(mount_options=MountOptions(fs_type="ext4", mount_flags=("noatime",)))
    assert with_opts.to_fs() == UsageOptions().to_fs()


def test_capability_merges_volume_and_usage_mount_options() -> None:
    """The usage's fs type wins, flags are combined without repeats; block ignores them."""
    usage = UsageOptions(
        access_mode=AccessMode.MULTI_NODE_MULTI_WRITER,
        mount_options=MountOptions(fs_type="xfs", mount_flags=("noatime", "sync")),
    )
    cap = usage.capability(MountOptions(fs_type="ext4", mount_flags=("ro", "noatime")))
    assert cap == t.VolumeCapability.mount(
        t.AccessMode.MULTI_NODE_MULTI_WRITER, "xfs", ("ro", "noatime", "sync")
    )
    block = UsageOptions(attachment_mode=AttachmentMode.BLOCK_DEVICE).capability()
    assert block == t.VolumeCapability.block(t.AccessMode.SINGLE_NODE_WRITER)


def test_volume_secrets_stay_out_of_repr() -> None:
    """A volume's secrets never show in its repr (logs, tracebacks)."""
    volume = CSIVolume(id="v", secrets={"password": "hunter2"})
    assert "hunter2" not in repr(volume)
    assert volume.external_id == "v"
    assert CSIVolume(id="v", remote_id="remote-7").external_id == "remote-7"


def test_free_reports_the_last_user() -> None:
    """Claims are per allocation; free is True only when nobody is left; both idempotent."""
    tracker = UsageTracker()
    assert tracker.claim("a", KEY) is True
    assert tracker.claim("a", KEY) is False
    tracker.claim("b", KEY)
    assert tracker.free("a", KEY) is False
    assert tracker.free("a", KEY) is False
    assert tracker.free("b", KEY) is True
    assert tracker.free("b", KEY) is True
    assert tracker.claims() == {}


def test_claims_are_persisted_and_reloaded(tmp_path: Path) -> None:
    """A tracker on the same file after a restart knows every claim and remote id."""
    path = str(tmp_path / "usage" / "plugin.json")
    tracker = UsageTracker(path)
    other = VolumeKey(namespace="ns", volume_id="vol", usage="ro-block-device-single-node-writer")
    tracker.claim("a", KEY, "remote-1")
    tracker.claim("b", KEY)
    tracker.claim("c", other)
    tracker.free("c", other)
    again = UsageTracker(path)
    assert again.claims() == {KEY: frozenset({"a", "b"})}
    assert again.remote_id(KEY) == "remote-1"
    assert again.remote_id(other) == "vol"


def test_claim_that_cannot_be_persisted_is_undone(tmp_path: Path) -> None:
    """If the state cannot be written the claim raises and is not kept in memory, so no
    mount proceeds on a claim a restart would forget."""
    tracker = UsageTracker(str(tmp_path / "usage" / "plugin.json"))
    tracker.claim("a", KEY)
    (tmp_path / "usage" / "plugin.json").unlink()
    (tmp_path / "usage").rmdir()
    (tmp_path / "usage").write_text("")  # the directory is now a file
    with pytest.raises(ManagerStateError):
        tracker.claim("b", KEY)
    with pytest.raises(ManagerStateError):
        tracker.free("a", KEY)
    assert tracker.users(KEY) == {"a"}


def test_rebuild_claims_every_namespace_that_has_the_volume_staged(tmp_path: Path) -> None:
    """Per-alloc paths carry no namespace: a mounted target is claimed in every namespace
    staging that volume and usage, in 'default' when none does; unmounted or foreign
    entries are skipped."""
    usage = "rw-file-system-single-node-writer"
    root = tmp_path / "root"
    for ns in ("blue", "green"):
        (root / "staging" / ns / "shared" / usage).mkdir(parents=True)
    mounted = {
        str(root / "per-alloc" / "a1" / "shared" / usage),
        str(root / "per-alloc" / "a2" / "lonely" / usage),
    }
    for path in [*mounted, str(root / "per-alloc" / "a3" / "shared" / usage)]:
        Path(path).mkdir(parents=True)
    (root / "per-alloc" / "a1" / "shared" / "not-a-usage").mkdir()
    tracker = UsageTracker()
    assert tracker.rebuild_from_mounts(str(root), lambda p: p in mounted) == 3
    assert tracker.claims() == {
        VolumeKey(namespace="blue", volume_id="shared", usage=usage): frozenset({"a1"}),
        VolumeKey(namespace="green", volume_id="shared", usage=usage): frozenset({"a1"}),
        VolumeKey(namespace="default", volume_id="lonely", usage=usage): frozenset({"a2"}),
    }
    assert tracker.rebuild_from_mounts(str(root), lambda p: p in mounted) == 0
