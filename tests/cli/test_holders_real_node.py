"""Covers kubevol.node.holders in the repair plan (kubevol.node.plan), on a real node's root.

On a kubelet root shaped as a real node has it (:mod:`kubevol.testing.kubelet_root`), a
process holding a file open in a volume of the pod named gone makes that volume's tear-down
refused, with the process named, in the plan and in the repair; the volume stays mounted
with its files, and the other pods are not touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.testing.kubelet_root import KubeletRoot
from kubevol.testing.mount_rig import mounts_under

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

_HOLD_OPEN = (
    "import sys, time; f = open(sys.argv[1], 'rb'); print('ready', flush=True); time.sleep(600)"
)


def _mounts_of(root: Path, uid: str) -> list[str]:
    return mounts_under(root / "pods" / uid)


def test_a_token_file_held_open_refuses_its_volume_on_a_real_node_root(
    real_node: KubeletRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pod 1 named gone; a process reads its service-account token. The dry run marks the
    kube-api-access volume's actions and the pod directory's removal refused naming the
    PID, and no other volume's; the repair leaves that tmpfs mounted with the token, and
    pods 0 and 2 keep every mount."""
    gone = real_node.pods[1]
    [token] = [v for v in real_node.volumes_of(gone) if v.name.startswith("kube-api-access-")]
    reader = subprocess.Popen([sys.executable, "-c", _HOLD_OPEN, str(token.path / "token")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
        flags = ["--root", str(real_node.root), "--node-name", real_node.node_name,
                 "--no-entry-points", "--pod-gone", gone]
        others = {uid: _mounts_of(real_node.root, uid) for uid in real_node.pods if uid != gone}
        capsys.readouterr()
        assert main(["reconstruct", "--repair", "--dry-run", *flags, "-o", "json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        refused = {(a["action"], a["volume"]) for a in plan["actions"] if a["refused"]}
        assert refused == {("unmount", token.name), ("remove dir", token.name),
                           ("remove pod dir", "")}
        assert all(f"process {reader.pid} (" in a["refused"] for a in plan["actions"]
                   if a["refused"] and a["volume"])
        assert {a["pod_uid"] for a in plan["actions"]} <= {gone, ""}
        main(["reconstruct", "--repair", *flags, "--timeout", "5s", "-o", "json"])
        err = capsys.readouterr().err
        assert f"process {reader.pid} (" in err
        assert os.path.ismount(token.path)
        assert (token.path / "token").read_bytes()
        assert {uid: _mounts_of(real_node.root, uid) for uid in others} == others
    finally:
        reader.kill()
        reader.wait()
