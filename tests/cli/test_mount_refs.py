"""Covers kubevol.cli.mount_refs: ``kubevol mount-refs``.

``kubevol mount-refs`` on real mounts: exit codes, JSON shape, table, bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.testing.mount_rig import KubeletTree, MountRig


@pytest.fixture
def two_volumes(rig: MountRig, kubelet: KubeletTree) -> tuple[Path, Path]:
    """Two volumes staged from one filesystem (the Lustre shape)."""
    dev = rig.loop()
    return (
        rig.mount(dev, kubelet.global_mount("vol-a")),
        rig.mount(dev, kubelet.global_mount("vol-b")),
    )


@pytest.mark.root
def test_blocked_under_kubelet_exits_3_with_json(
    two_volumes: tuple[Path, Path], kubelet: KubeletTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """Blocked: exit 3; JSON has exactly path, allowed, policy, refs with their four keys, and
    the message and warnings a table shows."""
    a, b = two_volumes
    code = main(["mount-refs", str(a), "--root", str(kubelet.root), "--policy", "kubelet",
                 "-o", "json"])
    assert code == 3
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["path", "allowed", "policy", "refs", "message", "warnings"]
    assert data["allowed"] is False
    assert data["policy"] == "kubelet"
    assert data["refs"] == [
        {"mount_point": str(b), "kind": "other-volume", "blocking": True,
         "reason": data["refs"][0]["reason"]}
    ]


@pytest.mark.root
def test_allowed_under_safe_exits_0_with_table(
    two_volumes: tuple[Path, Path], kubelet: KubeletTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """Allowed: exit 0; the table explains each reference."""
    a, b = two_volumes
    assert main(["mount-refs", str(a), "--root", str(kubelet.root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{a}: unmount allowed (policy safe)")
    assert "MOUNT POINT" in out
    assert f"{b}  other-volume  false" in out


@pytest.mark.root
def test_detach_follows_blocks(
    two_volumes: tuple[Path, Path], kubelet: KubeletTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """--detach-follows makes another volume's mount block under safe."""
    a, _ = two_volumes
    args = ["mount-refs", str(a), "--root", str(kubelet.root), "--detach-follows", "-o", "json"]
    assert main(args) == 3
    assert json.loads(capsys.readouterr().out)["refs"][0]["blocking"] is True


def test_mountinfo_file_is_used(
    tmp_path: Path, kubelet: KubeletTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """--mountinfo reads a saved table instead of the live one."""
    a = kubelet.global_mount("vol-a")
    saved = tmp_path / "mountinfo"
    saved.write_text(
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        f"2 1 0:99 / {a} rw - lustre 10.0.0.1@tcp:/fs rw\n"
        "3 1 0:99 / /mnt/elsewhere rw - lustre 10.0.0.1@tcp:/fs rw\n"
    )
    args = ["mount-refs", str(a), "--root", str(kubelet.root), "--mountinfo", str(saved)]
    assert main([*args, "--policy", "kubelet"]) == 3
    assert main([*args, "-o", "json"]) == 0
    out = capsys.readouterr()
    assert "/mnt/elsewhere" in out.out
    assert "warning: /mnt/elsewhere" in out.err


def test_missing_path_is_allowed(kubelet: KubeletTree, capsys: pytest.CaptureFixture[str]) -> None:
    """A path that does not exist is allowed with no references."""
    assert main(["mount-refs", str(kubelet.root / "gone"), "--root", str(kubelet.root)]) == 0
    assert "no other mount" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--root", "/nonexistent-root"], "is not a directory"),
        (["--mountinfo", "/nonexistent-mountinfo"], "/nonexistent-mountinfo"),
    ],
)
def test_bad_input_is_a_usage_error(
    kubelet: KubeletTree, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """A missing root or mount table file exits 64 (usage) with a message naming it."""
    args = ["mount-refs", str(kubelet.root), "--root", str(kubelet.root), *extra]
    assert main(args) == exits.USAGE
    assert message in capsys.readouterr().err


def test_malformed_mountinfo_is_a_usage_error(
    tmp_path: Path, kubelet: KubeletTree, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed mount table exits 64 (usage) naming the bad line."""
    bad = tmp_path / "bad"
    bad.write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\nnot a mountinfo line\n")
    args = ["mount-refs", str(kubelet.root), "--root", str(kubelet.root), "--mountinfo", str(bad)]
    assert main(args) == exits.USAGE
    assert "line 2" in capsys.readouterr().err


def test_unknown_policy_is_a_usage_error(kubelet: KubeletTree) -> None:
    """An unknown --policy is a usage error (exit 64)."""
    with pytest.raises(SystemExit) as info:
        main(["mount-refs", str(kubelet.root), "--policy", "strict"])
    assert info.value.code == exits.USAGE


def test_help_explains_policies_and_exit_codes() -> None:
    """The installed command's --help names both policies and the exit codes."""
    out = subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", "mount-refs", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout
    for word in ("kubelet", "safe", "--detach-follows", "--mountinfo", "0 the unmount is allowed",
                 "3 it is blocked", "64 bad input"):
        assert word in out
