"""Covers kubevol.plugins.csi.rules (tokenRequests) and kubevol.plugins.csi.plugin (republish).

CSI ``tokenRequests`` and ``requiresRepublish`` (issue 31, point 7), against the test
driver over gRPC: a driver whose CSIDriver object asks for tokens gets, at NodePublishVolume,
the pod's service-account tokens by audience under ``csi.storage.k8s.io/serviceAccount.tokens``
(JSON of TokenRequest statuses, as ``pkg/volume/csi/csi_mounter.go``'s
``podServiceAccountTokenAttrs`` writes it: an empty audience asks for the API server's own);
logs never show them; and a driver that requires republishing is published again at every
remount period of the agent."""

from __future__ import annotations

import base64
import datetime
import json
import threading
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.csi._pb import csi_pb2
from kubevol.csi.redact import STRIPPED, Redactor
from kubevol.k8s.tokens import TokenManager
from kubevol.node.agent import Agent
from kubevol.node.runtime import NodeRuntime
from kubevol.testing.csi_driver import DRIVER_NAME
from kubevol.testing.token_provider import StandInTokenProvider
from kubevol.testing.waiting import wait_until
from tests.csi.support import Served, ServeFactory

UID = "99999999-aaaa-3333-4444-555555555555"
TOKENS_KEY = "csi.storage.k8s.io/serviceAccount.tokens"


def manifests(**driver_spec: object) -> str:
    driver = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
              "metadata": {"name": DRIVER_NAME},
              "spec": {"attachRequired": False, "volumeLifecycleModes": ["Ephemeral"],
                       "tokenRequests": [{"audience": "vault", "expirationSeconds": 600},
                                         {"audience": ""}], **driver_spec}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "app", "namespace": "shop", "uid": UID},
           "spec": {"serviceAccountName": "reader", "containers": [{"name": "c", "image": "x"}],
                    "volumes": [{"name": "secrets", "csi": {"driver": DRIVER_NAME}}]}}
    return "\n---\n".join(json.dumps(o) for o in (driver, pod))


def claims(token: str) -> dict[str, object]:
    payload = token.split(".")[1]
    padded = payload + "=" * (-len(payload) % 4)
    data: dict[str, object] = json.loads(base64.urlsafe_b64decode(padded))
    return data


@pytest.fixture
def driver(serve_driver: ServeFactory) -> Served:
    return serve_driver()


@pytest.mark.root
def test_the_driver_gets_the_pods_tokens_by_audience(
    tmp_path: Path, driver: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(manifests())
    before = datetime.datetime.now(datetime.UTC)
    assert main(["-v", "5", "up", "--root", str(tmp_path / "root"), "--node-name", "n1",
                 "--csi-driver", f"{DRIVER_NAME}={driver.handle.address}",
                 "--token-provider", "kubevol-stand-in-token-provider", str(manifest)]) == exits.OK
    (publish,) = driver.driver.requests("NodePublishVolume")
    tokens = json.loads(publish["volume_context"][TOKENS_KEY])
    assert sorted(tokens) == ["", "vault"]
    for audience, lifetime in (("vault", 600), ("", 3600)):
        status = tokens[audience]
        assert sorted(status) == ["expirationTimestamp", "token"]
        expires = datetime.datetime.strptime(status["expirationTimestamp"],
                                             "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
        assert abs((expires - before).total_seconds() - lifetime) < 60, (audience, expires)
        issued = claims(status["token"])
        assert issued["sub"] == "system:serviceaccount:shop:reader"
        bound = issued["kubernetes.io"]
        assert isinstance(bound, dict) and bound["pod"] == {"name": "app", "uid": UID}
        if audience:
            assert issued["aud"] == [audience]
    err = capsys.readouterr().err
    assert tokens["vault"]["token"] not in err


def test_logged_requests_never_show_the_tokens() -> None:
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id="v", target_path="/t", volume_context={TOKENS_KEY: '{"":{"token":"abc"}}',
                                                          "size": "1Mi"})
    text = Redactor().to_text(request)
    assert "abc" not in text and STRIPPED in text and "1Mi" in text


@pytest.mark.slow
def test_a_driver_that_requires_republish_is_published_again(
    tmp_path: Path, driver: Served
) -> None:
    manifests_dir = tmp_path / "manifests"
    manifests_dir.mkdir()
    (manifests_dir / "app.yaml").write_text(manifests(requiresRepublish=True))
    stop = threading.Event()
    with NodeRuntime(str(tmp_path / "root"), node_name="n1",
                     csi_drivers={DRIVER_NAME: driver.handle.address},
                     tokens=TokenManager(StandInTokenProvider()), entry_points=False) as runtime:
        agent = Agent(runtime, manifest_dir=str(manifests_dir), remount_period=0.3)
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(lambda: len(driver.driver.requests("NodePublishVolume")) >= 3, 20,
                       "three NodePublishVolume calls")
        finally:
            stop.set()
            thread.join(30)
            agent.close()
    targets = {r["target_path"] for r in driver.driver.requests("NodePublishVolume")}
    assert len(targets) == 1
