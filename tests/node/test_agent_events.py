"""Covers kubevol.node.podevents and kubevol.k8s.events in the agent.

Events about pods' volumes (issue 31, point 9): with an API server, a pod whose volume
fails to mount gets the kubelet's Warning event ``FailedMount`` with its message shape
(``MountVolume.MountDevice failed for volume "<name>" : <error>``), counted as it repeats instead of
posted again, as client-go's recorder does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubevol.testing.kube_api import KubeAPIServer
from kubevol.testing.waiting import wait_until
from tests.node.test_agent import AgentEnv, env  # noqa: F401 (a fixture)
from tests.node.test_agent_api import (  # noqa: F401 (fixtures)
    APIAgent,
    api,
    api_pod,
    claim_objects,
    start_agent,
)


def events(server: KubeAPIServer) -> list[dict[str, Any]]:
    return [e for n in server.names("events")
            if (e := server.get("events", n, "shop")) is not None]


def test_a_failed_mount_is_an_event_on_the_pod(
    env: AgentEnv, api: KubeAPIServer, start_agent: Callable[[], APIAgent]  # noqa: F811
) -> None:
    claim_objects(api, "pv-gone", "no-such-volume")  # the driver has no such volume
    uid = api.add(api_pod("web", "n1", [
        {"name": "data", "persistentVolumeClaim": {"claimName": "pv-gone-claim"}},
    ]))["metadata"]["uid"]
    start_agent()
    wait_until(lambda: any(e["count"] >= 2 for e in events(api)), 30,
               "a FailedMount event counted twice")
    (event,) = [e for e in events(api) if e["reason"] == "FailedMount"]
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {"kind": "Pod", "apiVersion": "v1", "namespace": "shop",
                                       "name": "web", "uid": uid}
    # The driver stages first (STAGE_UNSTAGE_VOLUME): the staging step is what fails.
    assert event["message"] == (
        'MountVolume.MountDevice failed for volume "pv-gone" : /csi.v1.Node/NodeStageVolume: '
        "NOT_FOUND: volume 'no-such-volume' does not exist"), event["message"]
    assert event["source"] == {"component": "kubevol", "host": "n1"}
