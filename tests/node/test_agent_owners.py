"""Covers kubevol.node.agent and kubevol.cli.up sharing a root.

The agent and ``kubevol up`` on one root never take each other's pods (issue 28, point
5): a record says who wrote it; the agent tears down only pods it recorded, and ``up``
refuses a pod UID the agent runs, before anything is written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.node.agent import OwnedPods
from kubevol.testing.waiting import wait_until
from tests.node.test_agent import (  # noqa: F401  (fixtures)
    UIDS,
    AgentEnv,
    RunningAgent,
    env,
    pod,
    start_agent,
)

SCRATCH = "  - {name: scratch, emptyDir: {}}\n"


def record(root: Path, uid: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((root / "kubevol" / "pods" / f"{uid}.json").read_text())
    return data


def test_a_pod_up_runs_under_a_uid_the_agent_once_owned_is_left_alone(
    env: AgentEnv, start_agent: Callable[..., RunningAgent], tmp_path: Path  # noqa: F811
) -> None:
    """The agent's saved owner set still holds a UID (it tore that static pod down before);
    the same pod is then run with ``kubevol up``: the agent's next start keeps its emptyDir
    (it used to tear it down) and forgets the UID."""
    uid = UIDS["web"]
    OwnedPods(str(env.root)).save({uid})
    manifest = tmp_path / "web.yaml"
    manifest.write_text(pod("web", SCRATCH))
    assert main(["up", "--root", str(env.root), "--node-name", "n1", str(manifest)]) == 0
    assert record(env.root, uid)["writer"] == "up"
    running = start_agent()
    running.agent.apply_sources()
    wait_until(lambda: uid not in OwnedPods(str(env.root)).load(), 10, "the UID forgotten")
    assert Path(env.pod_volume("web", "scratch", "kubernetes.io~empty-dir")).is_dir()
    assert record(env.root, uid)["state"] == "running"


def test_up_refuses_a_pod_the_agent_runs(
    env: AgentEnv, start_agent: Callable[..., RunningAgent], tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A manifest claiming the UID of a static pod the agent runs is refused, naming the
    agent, and the agent's record is unchanged."""
    uid = UIDS["web"]
    (env.manifests / "web.yaml").write_text(pod("web", SCRATCH))
    start_agent()
    wait_until((env.root / "kubevol" / "pods" / f"{uid}.json").exists, 30, "record")
    before = record(env.root, uid)
    assert before["writer"] == "agent"
    manifest = tmp_path / "other.yaml"
    manifest.write_text(pod("web", "  - {name: other, emptyDir: {}}\n"))
    capsys.readouterr()
    assert main(["up", "--root", str(env.root), "--node-name", "n1", str(manifest)]) == 1
    assert "run by the kubevol agent" in capsys.readouterr().err
    assert record(env.root, uid) == before
