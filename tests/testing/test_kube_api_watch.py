"""Covers kubevol.testing.kube_api.

The stand-in API server's lists, watches and resourceVersions, driven through the real
``kubernetes`` client: what a client sees must be what an API server sends (event shapes,
the 410 Expired Status in a 200 stream, bookmarks, field selectors)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from kubevol.testing.kube_api import KubeAPIServer


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    """A stand-in API server on loopback."""
    with KubeAPIServer(event_window=50) as server:
        yield server


def pod(name: str, node: str, namespace: str = "default") -> dict[str, Any]:
    """A minimal Pod bound to ``node``."""
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}


def raw_events(api: KubeAPIServer, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """The decoded lines of a watch of every pod, read through the client's own request."""
    core = k8s.CoreV1Api(api.api_client())
    resp = core.list_pod_for_all_namespaces(watch=True, _preload_content=False, **kwargs)
    try:
        for line in watch.watch.iter_resp_lines(resp):
            if line:
                yield json.loads(line)
    finally:
        resp.release_conn()


def test_list_with_field_selector_and_resource_version(api: KubeAPIServer) -> None:
    """A pod list filtered on spec.nodeName answers only that node's pods, with the
    resourceVersion of the newest change; an unknown field is a 400."""
    api.add(pod("a", "n1"))
    api.add(pod("b", "n2", "other"))
    api.add(pod("c", "n1", "other"))
    core = k8s.CoreV1Api(api.api_client())
    listed = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert sorted(p.metadata.name for p in listed.items) == ["a", "c"]
    assert listed.metadata.resource_version == str(api.resource_version) == "3"
    assert {p.metadata.resource_version for p in listed.items} == {"1", "3"}
    other = core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=n1")
    assert [p.metadata.name for p in other.items] == ["b"]
    with pytest.raises(ApiException) as err:
        core.list_pod_for_all_namespaces(field_selector="spec.hostname=n1")
    assert err.value.status == 400


@pytest.mark.slow
def test_watch_from_a_resource_version_replays_later_changes(api: KubeAPIServer) -> None:
    """A watch from the list's resourceVersion gets exactly the later changes of the
    selected pods: ADDED, MODIFIED, DELETED, and DELETED/ADDED for a pod leaving or
    entering the selection; each object carries its own new resourceVersion."""
    api.add(pod("old", "n1"))
    since = api.resource_version
    api.add_config_map("default", "not-a-pod", {})
    api.add(pod("a", "n1"))
    api.add(pod("elsewhere", "n2"))
    api.update("pods", "a", {"status": {"phase": "Running"}}, "default")
    api.update("pods", "elsewhere", {"spec": {"nodeName": "n1"}}, "default")
    api.update("pods", "old", {"spec": {"nodeName": "n2"}}, "default")
    api.delete("pods", "a", "default")
    events = [
        (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])
        for e in raw_events(api, field_selector="spec.nodeName=n1",
                            resource_version=str(since), timeout_seconds=1)
    ]
    assert events == [("ADDED", "a", "3"), ("MODIFIED", "a", "5"), ("ADDED", "elsewhere", "6"),
                      ("DELETED", "old", "7"), ("DELETED", "a", "8")]


@pytest.mark.slow
def test_watch_without_resource_version_starts_with_the_current_state(
    api: KubeAPIServer,
) -> None:
    """Without a resourceVersion a watch first sends the current objects as ADDED, then the
    changes (the client's Watch helper deserialises them into V1Pod)."""
    api.add(pod("a", "n1"))
    core = k8s.CoreV1Api(api.api_client())
    seen = []
    w = watch.Watch()
    for event in w.stream(core.list_pod_for_all_namespaces, timeout_seconds=1):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 1:
            api.add(pod("b", "n1"))
    assert seen == [("ADDED", "a"), ("ADDED", "b")]


@pytest.mark.slow
def test_too_old_resource_version_is_410_expired(api: KubeAPIServer) -> None:
    """A watch from a compacted resourceVersion gets, in a 200 stream, one ERROR event whose
    object is the API's Expired Status; the client's Watch turns it into ApiException 410."""
    api.add(pod("a", "n1"))
    api.add(pod("b", "n1"))
    assert api.compact() == 2
    (event,) = list(raw_events(api, resource_version="1", timeout_seconds=5))
    assert event == {"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "too old resource version: 1 (2)", "reason": "Expired", "details": {},
        "code": 410}}
    core = k8s.CoreV1Api(api.api_client())
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version="1",
                                  timeout_seconds=5))
    assert err.value.status == 410
    # From the newest forgotten version on, nothing is missing: the watch is served.
    api.add(pod("c", "n1"))
    assert [e["type"] for e in raw_events(api, resource_version="2", timeout_seconds=1)] == [
        "ADDED"]


@pytest.mark.slow
def test_changes_beyond_the_window_expire_old_versions(api: KubeAPIServer) -> None:
    """Only ``event_window`` changes are kept: a resume from before them is 410."""
    api.add(pod("a", "n1"))
    for i in range(60):
        api.update("pods", "a", {"metadata": {"labels": {"i": str(i)}}}, "default")
    (event,) = list(raw_events(api, resource_version="1", timeout_seconds=5))
    assert event["object"]["code"] == 410
    events = list(raw_events(api, resource_version=str(api.resource_version - 3),
                             timeout_seconds=1))
    assert len(events) == 3


@pytest.mark.slow
def test_bookmarks_carry_only_the_resource_version(api: KubeAPIServer) -> None:
    """With allowWatchBookmarks a BOOKMARK carries kind, apiVersion and the current
    resourceVersion, including changes the selector filtered out; without it none is sent."""
    api.add(pod("a", "n1"))
    since = api.resource_version
    api.add(pod("b", "n2"))
    events: list[dict[str, Any]] = []

    def read(**kwargs: Any) -> None:
        events.extend(raw_events(api, resource_version=str(since), timeout_seconds=2,
                                 field_selector="spec.nodeName=n1", **kwargs))

    readers = [threading.Thread(target=read, kwargs={"allow_watch_bookmarks": True}),
               threading.Thread(target=read)]
    for r in readers:
        r.start()
    assert api.wait_for_watches(2)
    api.send_bookmark()
    for r in readers:
        r.join()
    assert events == [{"type": "BOOKMARK", "object": {
        "kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "2"}}}]


def test_dropped_watch_breaks_the_stream(api: KubeAPIServer) -> None:
    """drop_watches cuts the connection without the final chunk: the client sees a
    protocol error (not a clean end), as when an API server goes away."""
    api.add(pod("a", "n1"))
    errors: list[BaseException] = []
    seen: list[str] = []

    def read() -> None:
        try:
            for event in raw_events(api, resource_version="0", timeout_seconds=30):
                seen.append(event["type"])
        except Exception as exc:  # what the client raises is the point of the test
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    assert api.wait_for_watches(1)
    api.drop_watches()
    reader.join(10)
    assert not reader.is_alive()
    assert seen == ["ADDED"]
    assert len(errors) == 1 and isinstance(errors[0], urllib3.exceptions.HTTPError)


def test_csinode_and_node_objects(api: KubeAPIServer) -> None:
    """CSINodes are created, read and updated through StorageV1Api (an update from a stale
    resourceVersion is 409 Conflict); a Node's annotations take a patch, null deletes."""
    api.add_node("n1")
    core = k8s.CoreV1Api(api.api_client())
    storage = k8s.StorageV1Api(api.api_client())
    node = core.read_node("n1")
    created = storage.create_csi_node(k8s.V1CSINode(
        metadata=k8s.V1ObjectMeta(name="n1", owner_references=[k8s.V1OwnerReference(
            api_version="v1", kind="Node", name="n1", uid=node.metadata.uid)]),
        spec=k8s.V1CSINodeSpec(drivers=[])))
    assert created.metadata.owner_references[0].uid == node.metadata.uid
    created.spec.drivers = [k8s.V1CSINodeDriver(name="d", node_id="x")]
    updated = storage.replace_csi_node("n1", created)
    assert [d.node_id for d in updated.spec.drivers] == ["x"]
    with pytest.raises(ApiException) as err:
        storage.replace_csi_node("n1", created)  # still the old resourceVersion
    assert err.value.status == 409
    core.patch_node("n1", {"metadata": {"annotations": {"k": "v", "j": "w"}}})
    core.patch_node("n1", {"metadata": {"annotations": {"k": None}}})
    assert core.read_node("n1").metadata.annotations == {"j": "w"}
