"""Covers kubevol.node.agent with kubevol.node.api_pods.

``kubevol agent`` with an API server: the pods bound to its node on the stand-in API
server, read through the real ``kubernetes`` client (list, watch, resume, relist on 410),
mounted for real with the bundled hostpath CSI driver, beside a static pod."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.node.agent import Agent
from kubevol.node.api_pods import APIServerPods
from kubevol.node.runtime import NodeRuntime
from kubevol.plugins.csi.registration.nodeinfo import ANNOTATION_NODE_ID, NodeInfoManager
from kubevol.testing.kube_api import KubeAPIServer
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.node.test_agent import AgentEnv, AgentThreads, env, pod  # noqa: F401 (env: a fixture)


def api_pod(name: str, node: str, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A Pod as an API server holds it (status included)."""
    return {"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}],
                     "volumes": volumes},
            "status": {"phase": "Pending"}}


def claim_objects(api: KubeAPIServer, name: str, handle: str) -> None:
    """A CSI PersistentVolume on the hostpath driver and its bound claim."""
    api.add({"kind": "PersistentVolume", "apiVersion": "v1", "metadata": {"name": name},
             "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                      "csi": {"driver": DRIVER_NAME, "volumeHandle": handle},
                      "claimRef": {"namespace": "shop", "name": f"{name}-claim"}},
             "status": {"phase": "Bound"}})
    api.add({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
             "metadata": {"name": f"{name}-claim", "namespace": "shop"},
             "spec": {"volumeName": name, "accessModes": ["ReadWriteOnce"]},
             "status": {"phase": "Bound"}})


@attrs.define
class APIAgent:
    agent: Agent
    source: APIServerPods
    thread: threading.Thread
    stop: threading.Event


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    """The stand-in API server, with node n1 and the hostpath driver's CSIDriver saying no
    attach is needed (so nothing waits for an external attacher)."""
    with KubeAPIServer() as server:
        server.add_node("n1")
        server.add_csidriver({"metadata": {"name": DRIVER_NAME},
                              "spec": {"attachRequired": False}})
        yield server


@pytest.fixture
def start_agent(env: AgentEnv, api: KubeAPIServer) -> Iterator[Callable[[], APIAgent]]:  # noqa: F811
    threads = AgentThreads()

    def start() -> APIAgent:
        runtime = NodeRuntime(str(env.root), node_name="n1", kube_client=api.api_client(),
                              csi_drivers={DRIVER_NAME: env.driver.endpoint})
        source = APIServerPods(runtime.host.get_kube_client(), "n1", watch_timeout=30)
        agent = Agent(runtime, manifest_dir=str(env.manifests), api_pods=source,
                      node_info=NodeInfoManager(runtime.host.get_kube_client(), "n1"))
        thread, stop = threads.run(agent, runtime)
        return APIAgent(agent=agent, source=source, thread=thread, stop=stop)

    yield start
    threads.stop_all()


def pod_dir(where: AgentEnv, uid: str) -> str:
    return f"{where.root}/pods/{uid}"


def test_pods_of_the_node_come_and_go(
    env: AgentEnv, api: KubeAPIServer, start_agent: Callable[[], APIAgent]  # noqa: F811
) -> None:
    """The registered driver is published in CSINode and the nodeid annotation; pods bound
    to n1 are mounted (CSI claim read from the API, ConfigMap from the API, emptyDir) beside
    a static pod; a pod of another node is not; a dropped watch resumes
    from the last resourceVersion; a 410 relists, and a pod deleted meanwhile is torn
    down; a pod that Succeeded is torn down and its volume unstaged; the API server's
    bookmarks move the resume point."""
    handle = env.create_volume("web-data")
    claim_objects(api, "pv-web", handle)
    api.add_config_map("shop", "app", {"greeting": "hello"})
    web = api.add(api_pod("web", "n1", [
        {"name": "data", "persistentVolumeClaim": {"claimName": "pv-web-claim"}},
        {"name": "conf", "configMap": {"name": "app"}},
        {"name": "scratch", "emptyDir": {}},
    ]))["metadata"]["uid"]
    elsewhere = api.add(api_pod("elsewhere", "n2", [{"name": "s", "emptyDir": {}}]))
    (env.manifests / "db.yaml").write_text(pod("db", "  - {name: cache, emptyDir: {}}\n"))
    running = start_agent()

    web_mount = f"{pod_dir(env, web)}/volumes/kubernetes.io~csi/pv-web/mount"
    wait_until(lambda: web_mount in mounts_under(env.root), 30, "the CSI mount of the API pod")
    assert api.names("volumeattachments") == []  # the API's CSIDriver was read
    conf = Path(pod_dir(env, web)) / "volumes/kubernetes.io~configmap/conf/greeting"
    wait_until(conf.exists, 30, "the ConfigMap volume")
    assert conf.read_text() == "hello"
    assert (Path(pod_dir(env, web)) / "volumes/kubernetes.io~empty-dir/scratch").is_dir()
    assert not os.path.lexists(pod_dir(env, elsewhere["metadata"]["uid"]))
    wait_until(lambda: len(running.agent.running_pods()) == 2, 30, "the static pod beside it")
    assert running.source.lists == 1
    # The driver the agent was given is published as the kubelet does on registration.
    csinode = api.get("csinodes", "n1")
    assert csinode is not None and csinode["spec"]["drivers"] == [
        {"name": DRIVER_NAME, "nodeID": "n1", "topologyKeys": []}]
    n1 = api.get("nodes", "n1")
    assert n1 is not None
    assert n1["metadata"]["annotations"][ANNOTATION_NODE_ID] == f'{{"{DRIVER_NAME}":"n1"}}'
    # Every watch asks only for this node's pods, with bookmarks.
    watches = [q for m, p, q in api.queries if q.get("watch") == "true"]
    assert {q["fieldSelector"] for q in watches} == {"spec.nodeName=n1"}
    assert {q["allowWatchBookmarks"] for q in watches} == {"true"}

    # A change the selector hides, then a bookmark: the resume point moves past it.
    api.update("pods", "elsewhere", {"metadata": {"labels": {"x": "y"}}}, "shop")
    api.send_bookmark()
    wait_until(lambda: running.source.resource_version == str(api.resource_version),
        30, "the bookmark")

    # A dropped watch resumes from the last resourceVersion: no list.
    before = len(api.queries)
    resume_from = running.source.resource_version
    api.drop_watches()
    second = api.add(api_pod("second", "n1", [{"name": "s", "emptyDir": {}}]))["metadata"]["uid"]
    wait_until(lambda: os.path.isdir(
        f"{pod_dir(env, second)}/volumes/kubernetes.io~empty-dir/s"),
            30, "the pod added after the drop")
    resumed = [q for m, p, q in api.queries[before:] if q.get("watch") == "true"]
    assert resumed and resumed[0]["resourceVersion"] == resume_from
    assert running.source.lists == 1

    # The server forgets history while the watch is down: 410, relist, the deleted pod goes.
    api.drop_watches()
    api.delete("pods", "second", "shop")
    api.compact()
    wait_until(lambda: running.source.lists == 2, 30, "the relist")
    wait_until(lambda: not os.path.lexists(
        pod_dir(env, second)), 30, "the pod deleted meanwhile torn down")

    # The pod ends: its volumes are torn down and the CSI volume unstaged.
    assert [m for m in mounts_under(env.root) if m.endswith("/globalmount")]
    api.update("pods", "web", {"status": {"phase": "Succeeded"}}, "shop")
    wait_until(lambda: not os.path.lexists(pod_dir(env, web)), 30, "the finished pod torn down")
    assert not [m for m in mounts_under(env.root) if "pv-web" in m]
    assert running.agent.running_pods() == [
        u for u in running.agent.running_pods() if u not in (web, second)]
    assert len(running.agent.running_pods()) == 1  # the static pod stays


def test_nothing_is_torn_down_before_the_first_list(
    env: AgentEnv, api: KubeAPIServer, start_agent: Callable[[], APIAgent]  # noqa: F811
) -> None:
    """An agent restarted while the API server fails keeps the pods it ran; once the list
    succeeds, a pod deleted meanwhile is torn down and the others stay."""
    keep = api.add(api_pod("keep", "n1", [{"name": "s", "emptyDir": {}}]))["metadata"]["uid"]
    drop = api.add(api_pod("drop", "n1", [{"name": "s", "emptyDir": {}}]))["metadata"]["uid"]
    first = start_agent()
    wait_until(lambda: len(first.agent.running_pods()) == 2, 30, "both pods")
    first.stop.set()
    first.thread.join(30)
    first.agent.close()

    api.delete("pods", "drop", "shop")
    for _ in range(3):
        api.fail_next("GET", "/api/v1/pods", 503)
    second = start_agent()
    assert second.source.lists == 0
    assert os.path.isdir(pod_dir(env, drop)) and os.path.isdir(pod_dir(env, keep))
    wait_until(lambda: second.source.lists == 1, 60, "the list")
    wait_until(lambda: not os.path.lexists(pod_dir(env, drop)), 30, "the deleted pod torn down")
    assert second.agent.running_pods() == [keep]
