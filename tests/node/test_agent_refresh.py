"""Covers kubevol.node.agent and kubevol.node.manager: remounts and token renewal.

The agent sets volumes up again as the kubelet's pod sync does (issue 31, points 5 and 6):
ConfigMaps and Secrets given in its static manifests reach their volumes, a changed ConfigMap
reaches a running pod within the remount period (the kubelet's one minute by default;
shortened here), and a short-lived projected token is renewed before it expires."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kubevol.k8s.tokens import IssuedToken, TokenManager, TokenProvider, TokenRequest
from kubevol.node.agent import Agent
from kubevol.node.manager import DEFAULT_REMOUNT_PERIOD
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.waiting import wait_until
from tests.node.test_agent import (  # noqa: F401  (fixtures)
    UIDS,
    AgentEnv,
    RunningAgent,
    env,
    pod,
    set_ups,
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


def test_a_periodic_set_up_that_succeeds_does_not_wake_the_loop(
    env: AgentEnv, start_agent: Callable[..., RunningAgent],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing follows the periodic set-up of a volume that stays mounted: when it succeeds
    the loop is not woken for a pass (a node sets up a thousand such volumes every
    minute); the volumes are still set up again on time."""
    env.manifests.joinpath("web.yaml").write_text(objects("info") + pod("web", VOLUMES))
    running = start_agent(remount_period=0.3)
    wait_until(running.agent.settled.is_set, 30, "the agent settled")
    woken: list[int] = []
    poke = running.agent._poke

    def counted() -> None:
        woken.append(1)
        poke()

    monkeypatch.setattr(running.agent, "_poke", counted)
    before = set_ups(running, "kubernetes.io/configmap")
    wait_until(lambda: set_ups(running, "kubernetes.io/configmap") >= before + 3, 10,
               "three periodic set-ups of the configMap volume")
    assert woken == []


class ShortLivedTokens(TokenProvider):
    """Grants 5-second tokens whatever is asked (an issuer may shorten the lifetime)."""

    def __init__(self) -> None:
        self.issued = 0

    def request_token(self, request: TokenRequest) -> IssuedToken:
        self.issued += 1
        now = datetime.datetime.now(datetime.UTC)
        return IssuedToken(token=f"token-{self.issued}", expiration_seconds=5,
                           expiration=now + datetime.timedelta(seconds=5))


@pytest.mark.root
@pytest.mark.slow
def test_a_projected_token_is_renewed_before_it_expires(tmp_path: Path) -> None:
    """The kubelet's token manager renews a token once 80% of its life has passed; the
    agent's periodic set-up writes the renewed token into the running pod's volume before
    the old one expires."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "web.yaml").write_text(pod("web", """\
  - name: token
    projected:
      sources: [{serviceAccountToken: {path: token, audience: vault, expirationSeconds: 600}}]
"""))
    provider = ShortLivedTokens()
    stop = threading.Event()
    root = tmp_path / "root"
    with NodeRuntime(str(root), node_name="n1", entry_points=False,
                     tokens=TokenManager(provider, jitter=lambda: 0.0)) as runtime:
        agent = Agent(runtime, manifest_dir=str(manifests), remount_period=0.5)
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            token = root / "pods" / UIDS["web"] / "volumes/kubernetes.io~projected/token/token"
            wait_until(lambda: read(str(token)) == "token-1", 30, "the first token")
            first_seen = time.monotonic()
            wait_until(lambda: read(str(token)) == "token-2", 10, "the renewed token")
            assert time.monotonic() - first_seen < 5, "renewed only after the token expired"
        finally:
            stop.set()
            thread.join(30)
            agent.close()


def test_a_configmap_in_another_file_reaches_the_running_pod_at_once(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]  # noqa: F811
) -> None:
    """A pod whose manifest did not change is updated when an object it refers to changes
    in another file (the agent finds the pods a change touches through an index, not by
    asking each pod): the changed ConfigMap reaches its volume long before the periodic
    set-up would bring it."""
    (env.manifests / "objects.yaml").write_text(objects("info"))
    (env.manifests / "web.yaml").write_text(pod("web", VOLUMES))
    (env.manifests / "other.yaml").write_text(objects("info").replace("shop", "elsewhere"))
    running = start_agent(remount_period=3600)
    level = env.pod_volume("web", "settings", "kubernetes.io~configmap") + "/level"
    wait_until(lambda: read(level) == "info", 30, "the ConfigMap's key in the volume")
    wait_until(running.agent.settled.is_set, 30, "the agent settled")
    write_atomically(env.manifests / "other.yaml",
                     objects("debug").replace("shop", "elsewhere"))
    time.sleep(0.5)
    assert read(level) == "info"  # a ConfigMap of the same name in another namespace
    write_atomically(env.manifests / "objects.yaml", objects("debug"))
    wait_until(lambda: read(level) == "debug", 10, "the changed ConfigMap in the volume")
