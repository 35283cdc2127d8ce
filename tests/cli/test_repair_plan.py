"""Covers kubevol.node.plan through kubevol.cli.reconstruct (``reconstruct --repair``).

``reconstruct --repair``'s plan: ``--dry-run`` lists every action with its reason and
what is left alone, changes nothing; the real repair prints the same plan first and does
exactly its actions."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from kubevol.cli.main import main
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.node.rootlock import RootLock
from kubevol.testing.mount_rig import mounts_under
from tests.cli.test_node_cli import UID, foreign_pod_root
from tests.csi.support import HostPathServer


@pytest.fixture
def driver(serve_hostpath: HostPathServer) -> RunningDriver:
    """The hostpath driver served in-process (mounts under tmp_path undone after)."""
    return serve_hostpath()


def tree_digest(path: Path, *, exclude: Collection[Path] = ()) -> str:
    """A hash of every path, file content, link target and mode under ``path``, plus the
    mount table below it: any change shows. What is at or below ``exclude`` is left out
    (paths and mounts)."""
    skipped = {str(p) for p in exclude}
    h = hashlib.sha256()
    for top, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if os.path.join(top, d) not in skipped)
        for name in sorted(dirs + files):
            p = os.path.join(top, name)
            if p in skipped:
                continue
            st = os.lstat(p)
            h.update(f"{p}\0{st.st_mode}\0".encode())
            if os.path.islink(p):
                h.update(os.readlink(p).encode())
            elif name in files and os.path.isfile(p):
                with open(p, "rb") as f:
                    h.update(f.read())
    mounts = [m for m in mounts_under(path)
              if not any(m == x or m.startswith(x + "/") for x in skipped)]
    h.update("\n".join(mounts).encode())
    return h.hexdigest()


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """Run kubevol; exit status, its JSON output and its stderr."""
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


@pytest.mark.root
def test_dry_run_plans_nothing_for_a_foreign_pod_and_changes_nothing(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the pod named gone, the plan has no action and lists each of its volumes as
    left alone with the reason; the tree (paths, contents, links, mounts) is unchanged."""
    flags = foreign_pod_root(tmp_path, driver)
    before = tree_digest(tmp_path)
    code, plan, _ = run_json(capsys, "reconstruct", *flags, "--repair", "--dry-run",
                             "-o", "json")
    assert code == 0 and plan["actions"] == []
    left = {(x["volume"], x["reason"]) for x in plan["left"]}
    assert {v for v, _ in left} == {"pv1", "cache"}
    assert all("not kubevol's" in r for _, r in left)
    code, result, _ = run_json(capsys, "reconstruct", *flags, "--repair", "-o", "json")
    assert code == 0 and result["plan"]["actions"] == []
    assert tree_digest(tmp_path) == before


@pytest.mark.root
def test_dry_run_with_the_pod_named_gone_lists_its_tear_down_and_the_repair_does_it(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """Named gone, the pod's plan is: unmount and remove each volume, unstage the CSI
    device, remove the pod directory, each with the reason; --dry-run changes nothing, and
    the real repair prints the same plan (stderr), reports it (-o json) and does it."""
    flags = foreign_pod_root(tmp_path, driver)
    before = tree_digest(tmp_path)
    gone = ["--repair", "--pod-gone", UID]
    code, plan, _ = run_json(capsys, "reconstruct", *flags, *gone, "--dry-run", "-o", "json")
    assert code == 0 and plan["left"] == []
    actions = [(a["action"], a["volume"], os.path.basename(a["path"])) for a in plan["actions"]]
    assert ("unmount", "pv1", "mount") in actions
    assert ("remove dir", "pv1", "pv1") in actions
    assert ("unmount", "cache", "cache") in actions
    assert ("remove dir", "cache", "cache") in actions
    assert ("unstage", driver_volume(plan), "globalmount") in actions
    assert ("remove pod dir", "", UID) in actions
    assert all("named gone by the operator" in a["reason"]
               or a["action"] in ("unstage", "detach")
               for a in plan["actions"])
    assert tree_digest(tmp_path) == before
    # A plan with actions is done under the root's lock: while another writer holds it,
    # the repair waits, then gives up having changed nothing.
    with RootLock(flags[1], timeout=0):
        assert main(["reconstruct", *flags, *gone, "--timeout", "1"]) == 1
    assert "waiting for root" in capsys.readouterr().err
    assert tree_digest(tmp_path) == before

    code, result, err = run_json(capsys, "reconstruct", *flags, *gone, "-o", "json")
    assert code == 0
    assert result["plan"] == plan
    assert "remove pod dir" in err and "named gone by the operator" in err
    for a in plan["actions"]:
        if a["action"] in ("remove dir", "remove pod dir"):
            assert not os.path.lexists(a["path"]), a
    assert mounts_under(tmp_path) == []


def driver_volume(plan: dict[str, Any]) -> str:
    """The volume name of the plan's one unstage."""
    [unstage] = [a for a in plan["actions"] if a["action"] == "unstage"]
    assert unstage["volume"]
    return str(unstage["volume"])


def test_dry_run_needs_repair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dry-run alone is refused as a usage error (a plain reconstruct already changes
    nothing)."""
    assert main(["reconstruct", "--root", str(tmp_path / "r"), "--dry-run"]) == 64
    assert "go with --repair" in capsys.readouterr().err
