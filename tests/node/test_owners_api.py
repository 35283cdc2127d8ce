"""Covers kubevol.node.owners with an API server.

Issue 14's third owner, as issue 28 narrowed it: with an API server, a pod it listed on
this node by that UID and lists running no more is gone (deleted, bound elsewhere, finished);
one it lists, one being deleted, one it never listed (a kubelet's static pod, whose mirror
pod has another UID) is not; an API server that cannot answer makes nothing gone."""

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
    """Running on n1 or being deleted: not gone; listed finished, or listed on n1 and then
    deleted or bound elsewhere: gone, and the verdict says it was the API server. A pod it
    never listed on n1 is not gone. The list is read once per ``max_age``."""
    running = uid_of(api.add(pod("running", "n1")))
    deleting = uid_of(api.add(pod("deleting", "n1",
                                  metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"})))
    finished = uid_of(api.add(pod("finished", "n1", status={"phase": "Succeeded"})))
    failed = uid_of(api.add(pod("failed", "n1", status={"phase": "Failed"})))
    deleted = uid_of(api.add(pod("deleted", "n1")))
    elsewhere = uid_of(api.add(pod("elsewhere", "n2")))
    never = "0000000a-0000-4000-8000-00000000dead"
    own = Ownership(bindings=APIServerBindings(api.api_client(), "n1", max_age=0))
    for uid in (running, deleting, deleted, elsewhere, never):
        verdict = own.pod(uid)
        assert not verdict.allowed and "API server does not say it left" in verdict.reason
    api.delete("pods", "deleted", "shop")
    for uid in (finished, failed, deleted):
        verdict = own.pod(uid)
        assert verdict.allowed and "lists it running no more" in verdict.reason
        assert "node n1" in verdict.reason
    for uid in (running, deleting, elsewhere, never):
        assert not own.pod(uid).allowed, uid
    assert {q["fieldSelector"] for m, p, q in api.queries if p == "/api/v1/pods"} == {
        "spec.nodeName=n1"}


def mirror_of(static_uid: str, node: str = "n1") -> dict[str, Any]:
    """A mirror pod as the kubelet creates it for a static pod (``pkg/kubelet/types``:
    ``kubernetes.io/config.mirror`` holds the static pod's UID, ``config.hash`` too, and
    the API server gives the mirror a UID of its own)."""
    return pod("etcd-n1", node, metadata={"namespace": "kube-system", "annotations": {
        "kubernetes.io/config.mirror": static_uid,
        "kubernetes.io/config.hash": static_uid,
        "kubernetes.io/config.source": "file"}})


def test_a_static_pod_is_never_gone_through_the_api_server(api: KubeAPIServer) -> None:
    """A static pod lives on disk under its own UID; the API server lists only its mirror:
    while the mirror is listed, after it is deleted, and when there never was one, the
    static pod is not gone (the kubelet ends it only when its manifest goes)."""
    static = "6f1c8a5e2b0d4c7e9a3f1b2c3d4e5f60"
    mirror = uid_of(api.add(mirror_of(static)))
    assert mirror != static
    own = Ownership(bindings=APIServerBindings(api.api_client(), "n1", max_age=0))
    assert not own.pod(static).allowed
    api.delete("pods", "etcd-n1", "kube-system")
    assert not own.pod(static).allowed
    assert own.pod(mirror).allowed  # the mirror's own UID was listed and is gone


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


@pytest.mark.root
def test_reconstruct_repair_with_kubeconfig_leaves_pods_the_api_never_listed(
    tmp_path: Path, api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three pods on the root that kubevol does not run (no records): one the API server
    lists, one it never listed (deleted before, or a kubelet's static pod) and one whose
    mirror pod it lists. --repair with --kubeconfig tears none of them down: an API server
    says a pod left only about a UID it listed (issue 28: a static pod's emptyDir was
    deleted this way)."""
    if os.geteuid() != 0:
        pytest.fail("reconstruct --repair needs root")
    kept = uid_of(api.add(pod("kept", "n1")))
    unknown = "0000000a-0000-4000-8000-0000000000d1"
    static = "0000000a-0000-4000-8000-0000000000d2"
    api.add(mirror_of(static))
    root = str(tmp_path / "root")
    flags = ["--root", root, "--node-name", "n1"]
    pods = {"kept": kept, "unknown": unknown, "static": static}
    assert main(["up", *flags, str(manifest(tmp_path, pods))]) == 0
    for uid in pods.values():
        os.unlink(f"{root}/kubevol/pods/{uid}.json")  # someone else's pods now

    def scratch(uid: str) -> str:
        return f"{root}/pods/{uid}/volumes/kubernetes.io~empty-dir/scratch"

    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    capsys.readouterr()
    assert main(["reconstruct", *flags, "--repair", "--kubeconfig", kubeconfig]) == 0
    for uid in pods.values():
        assert os.path.isdir(scratch(uid)), uid


@pytest.mark.root
def test_up_with_kubeconfig_tears_down_no_pod_it_was_not_asked_about(
    tmp_path: Path, api: KubeAPIServer
) -> None:
    """``up --kubeconfig`` of an unrelated pod beside a static pod the API server shows only
    as a mirror, and beside a pod it finished: both keep their emptyDirs (``up`` asks the
    API server for objects and tokens, never which pods are gone)."""
    if os.geteuid() != 0:
        pytest.fail("up needs root")
    static = "0000000a-0000-4000-8000-0000000000e1"
    api.add(mirror_of(static))
    finished = uid_of(api.add(pod("finished", "n1", status={"phase": "Succeeded"})))
    root = str(tmp_path / "root")
    flags = ["--root", root, "--node-name", "n1"]
    (tmp_path / "a").mkdir()
    assert main(["up", *flags, str(manifest(tmp_path / "a", {"static": static,
                                                              "finished": finished}))]) == 0
    for uid in (static, finished):
        os.unlink(f"{root}/kubevol/pods/{uid}.json")  # a kubelet's pods now
    kubeconfig = api.write_kubeconfig(str(tmp_path / "kubeconfig"))
    mine = "0000000a-0000-4000-8000-0000000000e3"
    (tmp_path / "b").mkdir()
    assert main(["up", *flags, "--kubeconfig", kubeconfig,
                 str(manifest(tmp_path / "b", {"mine": mine}))]) == 0
    for uid in (static, finished, mine):
        assert os.path.isdir(f"{root}/pods/{uid}/volumes/kubernetes.io~empty-dir/scratch"), uid
