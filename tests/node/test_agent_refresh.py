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
from kubevol.node.operations import Operation
from kubevol.node.runtime import NodeRuntime
from kubevol.node.state import VolumeToMount
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


def token_pod_manifests(tmp_path: Path) -> Path:
    """A manifest directory under ``tmp_path`` with pod ``web``, whose projected volume
    holds an hour's service-account token."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "web.yaml").write_text(pod("web", """\
  - name: token
    projected:
      sources: [{serviceAccountToken: {path: token, expirationSeconds: 3600}}]
"""))
    return manifests


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
    # Set up again every period whatever the agent's policy (with an API server, say).
    running.agent.pods.manager.reconciler.remount_wanted = lambda volume: True
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


class CountedTokens(TokenProvider):
    """Grants tokens of ``lifetime`` seconds whatever is asked (an issuer may shorten the
    lifetime), or of the lifetime asked for (None), counting them."""

    def __init__(self, lifetime: int | None = None) -> None:
        self.lifetime = lifetime
        self.issued = 0

    def request_token(self, request: TokenRequest) -> IssuedToken:
        self.issued += 1
        now = datetime.datetime.now(datetime.UTC)
        seconds = self.lifetime or request.expiration_seconds or 3600
        return IssuedToken(token=f"token-{self.issued}", expiration_seconds=seconds,
                           expiration=now + datetime.timedelta(seconds=seconds))


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
    provider = CountedTokens(lifetime=5)
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


def test_without_an_api_server_what_the_manifests_project_is_set_up_again_on_change_only(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]  # noqa: F811
) -> None:
    """The agent hears of every change to what its manifests project: configMap and
    secret volumes are not set up again every period (the kubelet's sync does, hearing of
    nothing), but a changed Secret, which no record keeps, reaches its volume at once."""
    manifest = env.manifests / "web.yaml"
    manifest.write_text(objects("info") + pod("web", VOLUMES))
    running = start_agent(remount_period=0.2)
    wait_until(running.agent.settled.is_set, 30, "the agent settled")
    token = env.pod_volume("web", "creds", "kubernetes.io~secret") + "/token"
    before = set_ups(running, "kubernetes.io/configmap") + set_ups(running, "kubernetes.io/secret")
    time.sleep(1.5)  # seven periods
    after = set_ups(running, "kubernetes.io/configmap") + set_ups(running, "kubernetes.io/secret")
    assert after == before
    write_atomically(manifest, (objects("info") + pod("web", VOLUMES)).replace("s3cret", "new"))
    wait_until(lambda: read(token) == "new", 10, "the changed Secret in the volume")


def test_a_configmap_changed_while_the_agent_was_down_reaches_the_pod_at_restart(
    env: AgentEnv, start_agent: Callable[..., RunningAgent]  # noqa: F811
) -> None:
    """A restart takes the projected volumes it finds as done; what changed in the
    manifests meanwhile (the record keeps the ConfigMap the pod was set up with) sets them
    up again at once."""
    manifest = env.manifests / "web.yaml"
    manifest.write_text(objects("info") + pod("web", VOLUMES))
    running = start_agent(remount_period=3600)
    level = env.pod_volume("web", "settings", "kubernetes.io~configmap") + "/level"
    wait_until(lambda: read(level) == "info", 30, "the ConfigMap's key in the volume")
    running.stop.set()
    running.thread.join(30)
    write_atomically(manifest, objects("debug") + pod("web", VOLUMES))
    start_agent(remount_period=3600)
    wait_until(lambda: read(level) == "debug", 10, "the changed ConfigMap in the volume")


@pytest.mark.root
def test_a_projected_token_not_due_for_renewal_brings_no_periodic_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an API server, a projected volume with a token is set up again when the
    token manager would renew the token, not every period; and a restarted agent (whose
    token manager starts empty) knows from the root when that is."""
    manifests = token_pod_manifests(tmp_path)
    provider = CountedTokens()
    for run in range(2):
        stop = threading.Event()
        with NodeRuntime(str(tmp_path / "root"), node_name="n1", entry_points=False,
                         tokens=TokenManager(provider, jitter=lambda: 0.0)) as runtime:
            agent = Agent(runtime, manifest_dir=str(manifests), remount_period=0.2)
            generator = agent.pods.manager.generator
            set_up, set_ups_started = generator.set_up, list[str]()

            def counted(volume: VolumeToMount, set_up: Callable[..., Operation] = set_up,
                        started: list[str] = set_ups_started) -> Operation:
                started.append(volume.unique_name)
                return set_up(volume)

            monkeypatch.setattr(generator, "set_up", counted)
            thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
            thread.start()
            try:
                wait_until(agent.settled.is_set, 30, "the agent settled")
                time.sleep(1.5)  # seven periods
                assert len(set_ups_started) == (1 if run == 0 else 0)
                assert provider.issued == 1
            finally:
                stop.set()
                thread.join(30)
                agent.close()


@pytest.mark.root
def test_token_refresh_times_are_written_while_the_agent_is_idle(tmp_path: Path) -> None:
    """The token refresh times are written (an fsynced file) when the loop has nothing else
    to do, not between the passes of work in progress, where the write held up a pod's
    next step: while another pod's volume keeps failing (the loop stays busy) the new
    token's time is not written; once that pod's directory exists and its volume is set
    up, it is."""
    manifests = token_pod_manifests(tmp_path)
    missing = tmp_path / "data"
    (manifests / "db.yaml").write_text(pod("db", f"""\
  - {{name: data, hostPath: {{path: {missing}, type: Directory}}}}
"""))
    stop = threading.Event()
    root = tmp_path / "root"
    times = root / "kubevol" / "token-refresh.json"
    with NodeRuntime(str(root), node_name="n1", entry_points=False,
                     tokens=TokenManager(CountedTokens(), jitter=lambda: 0.0)) as runtime:
        agent = Agent(runtime, manifest_dir=str(manifests))
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            token = root / "pods" / UIDS["web"] / "volumes/kubernetes.io~projected/token/token"
            wait_until(lambda: read(str(token)) == "token-1", 30, "the token")
            wait_until(agent.pods.manager.executor.failures, 30,
                       "the hostPath volume failing")
            time.sleep(2.5)  # more than two of the loop's idle periods
            assert UIDS["web"] not in (read(str(times)) or ""), "written while busy"
            missing.mkdir()
            wait_until(agent.settled.is_set, 30, "the agent settled")
            wait_until(lambda: UIDS["web"] in (read(str(times)) or ""), 5,
                       "the token refresh time written")
        finally:
            stop.set()
            thread.join(30)
            agent.close()


def test_token_refresh_times_wait_until_the_agent_was_quiet_an_idle_period(
    tmp_path: Path,
) -> None:
    """The pass that leaves nothing to do may fall between two steps of a pod's set-up or
    tear-down (an operation ends, the next is not started yet): the times are written once
    the loop did no pass for an idle period, not right after that pass."""
    manifests = token_pod_manifests(tmp_path)
    stop = threading.Event()
    root = tmp_path / "root"
    times = root / "kubevol" / "token-refresh.json"
    with NodeRuntime(str(root), node_name="n1", entry_points=False,
                     tokens=TokenManager(CountedTokens(), jitter=lambda: 0.0)) as runtime:
        agent = Agent(runtime, manifest_dir=str(manifests), idle_period=3.0)
        manager = agent.pods.manager
        reconcile = manager.reconcile

        def operations_outrun_the_loop(*, full: bool = True) -> int:
            # On a loaded node the first pass's operations (which fetch the token) may end
            # before the loop thread goes on: the first loop step must not write then.
            started = reconcile(full=full)
            wait_until(lambda: not manager.executor.running(), 30, "the first operations")
            manager.reconcile = reconcile  # type: ignore[method-assign]
            return started

        manager.reconcile = operations_outrun_the_loop  # type: ignore[method-assign]
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(agent.settled.is_set, 30, "the agent settled")
            settled = time.monotonic()
            time.sleep(1.0)
            assert UIDS["web"] not in (read(str(times)) or ""), "written right after a pass"
            wait_until(lambda: UIDS["web"] in (read(str(times)) or ""), 10,
                       "the token refresh time written")
            assert time.monotonic() - settled >= 2.0
        finally:
            stop.set()
            thread.join(30)
            agent.close()
