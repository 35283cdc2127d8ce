"""Covers kubevol.plugins.csi.registration.nodeinfo.

CSINode entries and the csi.volume.kubernetes.io/nodeid annotation, written through the
real kubernetes client to the stand-in API server when drivers register and deregister
through plugins_registry (as the kubelet's nodeinfomanager does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kubevol.plugins.csi.registration import PluginWatcher, serve_registration
from kubevol.plugins.csi.registration.nodeinfo import (
    ANNOTATION_NODE_ID,
    NodeInfoError,
    NodeInfoManager,
)
from kubevol.testing.kube_api import KubeAPIServer
from kubevol.testing.waiting import wait_until
from tests.plugins.csi.plugin.csiplugin_driver import DRIVER_NAME, NODE_ID
from tests.plugins.csi.registration.conftest import Node


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    """The stand-in API server with Node n1."""
    with KubeAPIServer() as server:
        server.add_node("n1", labels={"kubernetes.io/hostname": "n1"})
        yield server


def drivers(api: KubeAPIServer) -> list[dict[str, Any]]:
    csinode = api.get("csinodes", "n1")
    assert csinode is not None
    return list(csinode["spec"]["drivers"])


def annotation(api: KubeAPIServer) -> dict[str, str] | None:
    node = api.get("nodes", "n1")
    assert node is not None
    text = (node["metadata"].get("annotations") or {}).get(ANNOTATION_NODE_ID)
    return None if text is None else dict(json.loads(text))


def test_registration_publishes_and_deregistration_unpublishes(
    node: Node, api: KubeAPIServer
) -> None:
    """A driver registering through plugins_registry creates the missing CSINode (owned by
    the Node) with its entry — node ID, topology keys, allocatable count from NodeGetInfo —
    and adds its key to the nodeid annotation and its topology to the Node's labels; its
    socket going removes the entry and the key (the CSINode stays); an unrelated driver's
    key is kept."""
    api.update("nodes", "n1", {"metadata": {"annotations": {
        ANNOTATION_NODE_ID: json.dumps({"other.example.com": "o-1"})}}})
    info = NodeInfoManager(api.api_client(), "n1")
    info.follow(node.registry)
    with PluginWatcher.for_registry(str(node.registry_dir), node.registry, resync_interval=60):
        server = serve_registration(node.handle, DRIVER_NAME, str(node.registry_dir))
        try:
            status = server.wait_for_status(10)
            assert status is not None and status.registered
            assert drivers(api) == [{"name": DRIVER_NAME, "nodeID": NODE_ID,
                                     "topologyKeys": sorted(node.driver.topology),
                                     "allocatable": {"count": 3}}]
            csinode = api.get("csinodes", "n1")
            n1 = api.get("nodes", "n1")
            assert csinode is not None and n1 is not None
            assert csinode["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": n1["metadata"]["uid"]}]
            assert annotation(api) == {"other.example.com": "o-1", DRIVER_NAME: NODE_ID}
            assert n1["metadata"]["labels"] == {"kubernetes.io/hostname": "n1",
                                                **node.driver.topology}
        finally:
            server.stop()
        wait_until(lambda: not node.registry.is_registered(DRIVER_NAME))
    wait_until(lambda: drivers(api) == [])
    assert annotation(api) == {"other.example.com": "o-1"}
    assert info.errors == {}


def test_registry_closing_keeps_the_entries(node: Node, api: KubeAPIServer) -> None:
    """An agent that stops (its registry closes) does not unpublish its drivers; with no
    other driver left, a deregistration removes the whole annotation."""
    info = NodeInfoManager(api.api_client(), "n1")
    node.registry.register_driver(DRIVER_NAME, node.handle.endpoint.address, ["1.0.0"])
    info.follow(node.registry)  # publishes what is registered already
    assert [d["name"] for d in drivers(api)] == [DRIVER_NAME]
    node.registry.close()
    assert [d["name"] for d in drivers(api)] == [DRIVER_NAME]
    assert annotation(api) == {DRIVER_NAME: NODE_ID}
    info.uninstall_driver(DRIVER_NAME)
    assert annotation(api) is None and drivers(api) == []


@pytest.mark.slow
def test_updates_retry_conflicts_and_respect_upstream_rules(api: KubeAPIServer) -> None:
    """A CSINode update that meets a newer object (409) is retried on a fresh read; an
    unchanged entry is not rewritten; no allocatable count without a limit; an empty node ID
    and a topology label that already has another value are refused."""
    slept: list[float] = []
    info = NodeInfoManager(api.api_client(), "n1", sleep=slept.append)
    info.install_driver("a.example.com", "a-1", 0, {})
    api.fail_next("PUT", "/apis/storage.k8s.io/v1/csinodes/n1", 409)
    info.install_driver("b.example.com", "b-1", 5, {"zone": "z1"})
    assert slept == [0.01]
    assert drivers(api) == [
        {"name": "a.example.com", "nodeID": "a-1", "topologyKeys": []},
        {"name": "b.example.com", "nodeID": "b-1", "topologyKeys": ["zone"],
         "allocatable": {"count": 5}}]
    version = api.resource_version
    info.install_driver("b.example.com", "b-1", 5, {"zone": "z1"})
    assert api.resource_version == version  # nothing to change, nothing written
    with pytest.raises(NodeInfoError, match="driverNodeID must not be empty"):
        info.install_driver("c.example.com", "", 0, {})
    with pytest.raises(NodeInfoError, match="topology value collision"):
        info.install_driver("c.example.com", "c-1", 0, {"zone": "z2"})
    assert slept[1:] == [0.01, 0.05, 0.25]  # the collision was tried four times
