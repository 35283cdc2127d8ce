"""Covers kubevol.node.api_pods with kubevol.node.validation.

Pods from the API server are checked as manifest files are before they are used (issue
28, point 6): one the API server should have refused is reported under its name and
skipped; the others run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kubevol.node.api_pods import APIServerPods
from kubevol.testing.kube_api import KubeAPIServer


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    """The stand-in API server with Node n1."""
    with KubeAPIServer() as server:
        server.add_node("n1")
        yield server


def source_of(api: KubeAPIServer) -> APIServerPods:
    """The pods of n1, listed and watched (one-second watches: closing waits for one)."""
    return APIServerPods(api.api_client(), "n1", watch_timeout=1).start()


def api_pod(name: str, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A Pod of node n1 as the API server holds it."""
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}],
                     "volumes": volumes},
            "status": {"phase": "Pending"}}


@pytest.mark.slow
def test_an_invalid_pod_is_reported_and_skipped_and_the_others_run(api: KubeAPIServer) -> None:
    """A pod with a setuid defaultMode beside a valid one: the valid one is in manifests(),
    the invalid one in errors with the field (its claim never read) and among the
    unresolved, so a pod that ran is not torn down for it."""
    bad = api.add(api_pod("bad", [
        {"name": "conf", "configMap": {"name": "app", "defaultMode": 0o4755}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
    ]))["metadata"]["uid"]
    good = api.add(api_pod("good", [{"name": "scratch", "emptyDir": {}}]))["metadata"]["uid"]
    with source_of(api) as source:
        assert source.synced.wait(30), "the first list"
        manifests = source.manifests()
        assert [p["metadata"]["uid"] for p in manifests.pods] == [good]
        assert list(source.errors) == ["pod shop/bad"]
        assert "volume conf: configMap.defaultMode 2541 (0o4755) is not valid: must be a " \
            "number between 0 and 0777 (octal), both inclusive" in source.errors["pod shop/bad"]
        assert source.unresolved() == {bad}
        assert not [q for q in api.queries if "persistentvolumeclaims" in q[1]]


@pytest.mark.slow
def test_an_invalid_sub_path_from_the_api_server_is_refused(api: KubeAPIServer) -> None:
    """A container's subPath out of its volume is reported the same way."""
    pod = api_pod("escape", [{"name": "scratch", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/m", "subPath": "../../etc"}]
    api.add(pod)
    with source_of(api) as source:
        assert source.synced.wait(30), "the first list"
        assert source.manifests().pods == ()
        assert "containers[0].volumeMounts[0].subPath" in source.errors["pod shop/escape"]
