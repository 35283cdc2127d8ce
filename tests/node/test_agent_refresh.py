"""The agent sets volumes up again as the kubelet's pod sync does (issue 31, points 5 and 6):
ConfigMaps and Secrets given in its static manifests reach their volumes, and a changed
ConfigMap reaches a running pod within the remount period (the kubelet's one minute by
default; shortened here)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kubevol.node.agent import Agent
from kubevol.node.manager import DEFAULT_REMOUNT_PERIOD
from kubevol.testing.waiting import wait_until
from tests.node.test_agent import (  # noqa: F401  (fixtures)
    AgentEnv,
    RunningAgent,
    env,
    pod,
    start_agent,
    write_atomically,
)

VOLUMES = """\
  - {name: settings, configMap: {name: settings}}
  - {name: creds, secret: {secretName: creds}}
"""


def objects(level: str) -> str:
    return f"""---
apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: shop}}
data: {{level: {level}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: creds, namespace: shop}}
stringData: {{token: s3cret}}
"""


def read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def test_the_kubelets_sync_period_is_the_default() -> None:
    assert DEFAULT_REMOUNT_PERIOD == 60.0
    defaults = Agent.__init__.__kwdefaults__
    assert defaults is not None and defaults["remount_period"] == DEFAULT_REMOUNT_PERIOD


def test_static_configmaps_and_secrets_reach_the_pod_and_changes_follow(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]  # noqa: F811
) -> None:
    manifest = env.manifests / "web.yaml"
    manifest.write_text(objects("info") + pod("web", VOLUMES))
    start_agent(remount_period=0.5)
    level = env.pod_volume("web", "settings", "kubernetes.io~configmap") + "/level"
    token = env.pod_volume("web", "creds", "kubernetes.io~secret") + "/token"
    wait_until(lambda: read(level) == "info", 30, "the ConfigMap's key in the volume")
    wait_until(lambda: read(token) == "s3cret", 10, "the Secret's key in the volume")
    write_atomically(manifest, objects("debug") + pod("web", VOLUMES))
    wait_until(lambda: read(level) == "debug", 10, "the changed ConfigMap in the volume")
