"""Issue 14's third owner: with an API server, a pod it does not list as running on this
node any more is gone (deleted, bound elsewhere, finished); one it lists, or one being
deleted, is not; an API server that cannot answer makes nothing gone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubevol.cli.main import main
from kubevol.node.owners import APIServerBindings, Ownership
from kubevol.testing.kube_api import KubeAPIServer


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    """The stand-in API server with Node n1."""
    with KubeAPIServer() as server:
        server.add_node("n1")
        yield server


def pod(name: str, node: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Pod", "apiVersion": "v1", "metadata": {"name": name, "namespace": "shop"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"}}
    for key, value in extra.items():
        body[key].update(value)
    return body


def uid_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def test_the_api_server_says_which_pods_left_the_node(api: KubeAPIServer) -> None:
    """Running on n1 or being deleted: not gone; finished, bound elsewhere or absent: gone,
    and the verdict says it was the API server. The list is read once for many questions."""
    running = uid_of(api.add(pod("running", "n1")))
    deleting = uid_of(api.add(pod("deleting", "n1",
                                  metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"})))
    finished = uid_of(api.add(pod("finished", "n1", status={"phase": "Succeeded"})))
    failed = uid_of(api.add(pod("failed", "n1", status={"phase": "Failed"})))
    moved = uid_of(api.add(pod("moved", "n2")))
    own = Ownership(bindings=APIServerBindings(api.api_client(), "n1", max_age=60))
    for uid in (running, deleting):
        verdict = own.pod(uid)
        assert not verdict.allowed and "API server does not say it left" in verdict.reason
    for uid in (finished, failed, moved, "0000000a-0000-4000-8000-00000000dead"):
        verdict = own.pod(uid)
        assert verdict.allowed and "API server lists no running pod" in verdict.reason
        assert "node n1" in verdict.reason
    assert [q["fieldSelector"] for m, p, q in api.queries if p == "/api/v1/pods"] == [
        "spec.nodeName=n1"]


def test_an_api_server_that_cannot_answer_makes_nothing_gone(api: KubeAPIServer) -> None:
    """A node the API server does not know (a wrong --node-name would make every pod look
    gone) or a failing list: every pod stays not kubevol's, and the reason is kept."""
    unknown = APIServerBindings(api.api_client(), "n9")
    assert not Ownership(bindings=unknown).pod("some-pod").allowed
    assert unknown.error == "node n9 is not known to the API server"
    api.fail_next("GET", "/api/v1/pods", 500)
    failing = APIServerBindings(api.api_client(), "n1")
    assert not Ownership(bindings=failing).pod("some-pod").allowed
    assert failing.error is not None and "500" in failing.error


def manifest(tmp_path: Path, uids: dict[str, str]) -> Path:
    docs = [f"""---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: shop, uid: {uid}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes: [{{name: scratch, emptyDir: {{}}}}]
""" for name, uid in uids.items()]
    path = tmp_path / "pods.yaml"
    path.write_text("".join(docs))
    return path


def test_reconstruct_repair_with_kubeconfig_cleans_only_pods_the_api_says_left(
    tmp_path: Path, api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two pods on the root that kubevol does not run (no records): without an API server
    --repair leaves both; with --kubeconfig the one the API server still lists on the node
    stays and the deleted one is torn down."""
    if os.geteuid() != 0:
        pytest.fail("reconstruct --repair needs root")
    kept = uid_of(api.add(pod("kept", "n1")))
    deleted = "0000000a-0000-4000-8000-0000000000d1"
    root = str(tmp_path / "root")
    flags = ["--root", root, "--node-name", "n1"]
    assert main(["up", *flags, str(manifest(tmp_path, {"kept": kept, "deleted": deleted}))]) == 0
    for uid in (kept, deleted):
        os.unlink(f"{root}/kubevol/pods/{uid}.json")  # someone else's pods now

    def scratch(uid: str) -> str:
        return f"{root}/pods/{uid}/volumes/kubernetes.io~empty-dir/scratch"

    assert main(["reconstruct", *flags, "--repair"]) == 0
    assert os.path.isdir(scratch(kept)) and os.path.isdir(scratch(deleted))
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    capsys.readouterr()
    assert main(["reconstruct", *flags, "--repair", "--kubeconfig", kubeconfig]) == 0
    plan = capsys.readouterr().err
    assert "API server lists no running pod" in plan and deleted in plan
    assert os.path.isdir(scratch(kept))
    assert not os.path.exists(scratch(deleted))
