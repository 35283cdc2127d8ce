"""Covers kubevol.cli.up, kubevol.cli.reconstruct and kubevol.cli.down with every volume kind.

``kubevol up`` of the example pod with every common volume kind (configMap, secret,
downwardAPI, projected with a token from a provider, local PV, emptyDir, a CSI PV with two
subPath mounts), ``reconstruct`` after the process is gone, and ``down`` leaving nothing;
canary secret and token values never reach the output or the logs."""

from __future__ import annotations

import logging
import os
import stat
import sys
from pathlib import Path

import pytest

from kubevol.cli.demo import examples_dir
from kubevol.cli.main import main
from kubevol.csidriver.drivers.common import RunningDriver
from kubevol.csidriver.drivers.hostpath import DRIVER_NAME
from kubevol.testing.mount_rig import mounts_under
from tests.cli.test_node_cli import create_volume, run_json
from tests.csi.support import HostPathServer

CANARY_SECRET = "canary-secret-9d41c"
CANARY_TOKEN = "canary-token-5be07"
NODE = "demo-node"


@pytest.fixture
def driver(serve_hostpath: HostPathServer) -> RunningDriver:
    return serve_hostpath(NODE)


def example(tmp_path: Path, handle: str) -> Path:
    """kubevol/examples/app.yaml with the placeholders filled and a canary password."""
    text = (examples_dir() / "app.yaml").read_text()
    text = text.replace("${DEMO_DIR}", str(tmp_path)).replace("created-by-the-demo", handle)
    text = text.replace("demo-only-password", CANARY_SECRET)
    (tmp_path / "local-disk").mkdir()
    path = tmp_path / "app.yaml"
    path.write_text(text)
    return path


def token_provider(tmp_path: Path) -> str:
    """A provider command answering with a canary token."""
    script = tmp_path / "provider.py"
    script.write_text(
        "import json, sys\n"
        "req = json.load(sys.stdin)\n"
        f"req['status'] = {{'token': '{CANARY_TOKEN}.' + req['spec']['boundObjectRef']['uid'],"
        " 'expirationTimestamp': '2099-01-01T00:00:00Z'}\n"
        "print(json.dumps(req))\n"
    )
    return f"{sys.executable} {script}"


@pytest.mark.root
def test_every_kind_up_reconstructed_and_down(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """All seven kinds set up at the kubelet's paths with two subPath binds; rebuilt from
    disk by another run; torn down with nothing left. No canary anywhere in the output."""
    caplog.set_level(logging.DEBUG)
    manifest = example(tmp_path, create_volume(driver))
    root = tmp_path / "root"
    flags = ["--root", str(root), "--node-name", NODE]
    code, rows = run_json(capsys, "up", *flags, "--csi-driver", f"{DRIVER_NAME}={driver.endpoint}",
                          "--token-provider", token_provider(tmp_path), "-o", "json",
                          str(manifest))
    assert code == 0, rows
    assert isinstance(rows, list)
    by_volume = {r["volume"]: r for r in rows}
    assert {v: r["plugin"] for v, r in by_volume.items()} == {
        "config": "kubernetes.io/configmap", "credentials": "kubernetes.io/secret",
        "podinfo": "kubernetes.io/downward-api", "kube-api-access": "kubernetes.io/projected",
        "local": "kubernetes.io/local-volume", "scratch": "kubernetes.io/empty-dir",
        "shared": "kubernetes.io/csi",
    }
    # Set up: a mount, or a plain directory on disk with nothing to mount (one vocabulary).
    assert {r["state"] for r in rows} <= {"mounted", "present"}
    projected = Path(by_volume["kube-api-access"]["path"])
    assert (projected / "token").read_text().startswith(CANARY_TOKEN)
    # fsGroup 3000: written 0600, made group-readable by the fsGroup rules.
    assert stat.S_IMODE((projected / "token").stat().st_mode) == 0o640
    assert Path(by_volume["credentials"]["path"], "password").read_text() == CANARY_SECRET
    pod_dir = projected.parents[2]
    subpaths = sorted(str(p) for p in (pod_dir / "volume-subpaths/pv-shared/app").iterdir())
    assert [p.rsplit("/", 1)[1] for p in subpaths] == ["6", "7"]
    assert set(subpaths) <= set(mounts_under(tmp_path))
    csi_mount = Path(by_volume["shared"]["path"])
    assert (csi_mount / "cache/app").is_dir()  # made for the subPathExpr $(POD_NAME)

    code, found = run_json(capsys, "reconstruct", *flags, "-o", "json")
    assert code == 0 and isinstance(found, dict)
    assert sorted(v["plugin"] for v in found["volumes"]) == sorted(
        r["plugin"] for r in rows)
    [shared] = [v for v in found["volumes"] if v["plugin"] == "kubernetes.io/csi"]
    assert shared["subpaths"] == subpaths
    assert found["failures"] == []

    assert main(["down", *flags, str(manifest)]) == 0
    assert mounts_under(tmp_path) == []
    assert not pod_dir.exists()
    assert (tmp_path / "local-disk").is_dir()  # the node's disk stays

    out = capsys.readouterr()
    for canary in (CANARY_SECRET, CANARY_TOKEN):
        assert canary not in out.out + out.err
        assert canary not in caplog.text


@pytest.mark.root
def test_a_token_without_a_provider_is_a_clear_error(
    tmp_path: Path, driver: RunningDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --token-provider and no --kubeconfig: up fails naming the pod, the volume and the
    flags; the other volumes are set up."""
    manifest = example(tmp_path, create_volume(driver))
    flags = ["--root", str(tmp_path / "root"), "--node-name", NODE]
    code = main(["up", *flags, "--csi-driver", f"{DRIVER_NAME}={driver.endpoint}",
                 "--timeout", "3s", str(manifest)])
    assert code == 1
    err = capsys.readouterr().err
    assert "pod demo/app volume 'kube-api-access' needs a service-account token" in err
    assert "--token-provider" in err and "--kubeconfig" in err
    assert main(["down", *flags, str(manifest)]) == 0
    assert mounts_under(tmp_path) == []


@pytest.mark.root
def test_up_reads_objects_and_tokens_from_an_api_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """With --kubeconfig, ConfigMaps and Secrets missing from the manifests come from the
    API server and the token from its TokenRequest API, bound to the pod."""
    from kubevol.testing.kube_api import KubeAPIServer

    if os.geteuid() != 0:
        pytest.fail("the node CLI tests need root (real mounts)")
    caplog.set_level(logging.DEBUG)
    with KubeAPIServer() as api:
        api.add_config_map("shop", "settings", {"mode": "fast"})
        api.add_secret("shop", "db", {"password": CANARY_SECRET})
        api.add_service_account("shop", "web")
        api.token_factory = lambda ns, sa, spec: f"{CANARY_TOKEN}-{ns}-{sa}"
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: c, cluster: {{server: '{api.url}'}}}}]\n"
            "users: [{name: u, user: {token: kubeconfig-bearer}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
        )
        manifest = tmp_path / "web.yaml"
        manifest.write_text("""
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, uid: 99999999-2222-3333-4444-555555555555}
spec:
  serviceAccountName: web
  containers: [{name: c, image: x}]
  volumes:
  - {name: settings, configMap: {name: settings}}
  - {name: db, secret: {secretName: db}}
  - name: api
    projected:
      sources:
      - serviceAccountToken: {path: token, audience: shop-api}
""")
        root = tmp_path / "root"
        flags = ["--root", str(root), "--node-name", "n1"]
        code, rows = run_json(capsys, "up", *flags, "--kubeconfig", str(kubeconfig),
                              "-o", "json", str(manifest))
        assert code == 0, rows
        assert isinstance(rows, list)
        paths = {r["volume"]: Path(r["path"]) for r in rows}
        assert (paths["settings"] / "mode").read_text() == "fast"
        assert (paths["db"] / "password").read_text() == CANARY_SECRET
        assert (paths["api"] / "token").read_text() == f"{CANARY_TOKEN}-shop-web"
        [(_, _, body)] = api.token_requests
        assert body["spec"]["audiences"] == ["shop-api"]
        assert body["spec"]["boundObjectRef"]["name"] == "web"
        assert ("GET", "/api/v1/namespaces/shop/secrets/db") in api.requests
        assert main(["down", *flags, str(manifest)]) == 0
    assert mounts_under(tmp_path) == []
    out = capsys.readouterr()
    for canary in (CANARY_SECRET, CANARY_TOKEN):
        assert canary not in out.out + out.err
        assert canary not in caplog.text


def test_the_packaged_examples_hold_every_kind(tmp_path: Path) -> None:
    """The demo's examples (shipped in the package) include the pod with every common kind,
    so ``kubevol demo`` shows and checks them."""
    from kubevol.cli.demo import load_examples

    manifests = load_examples(examples_dir(), str(tmp_path))
    assert ("demo", "app-config") in manifests.config_maps
    assert ("demo", "app-credentials") in manifests.secrets
    [app] = [p for p in manifests.pods if p["metadata"]["name"] == "app"]
    kinds = {next(k for k in v if k != "name") for v in app["spec"]["volumes"]}
    assert kinds == {"configMap", "secret", "downwardAPI", "projected",
                     "persistentVolumeClaim", "emptyDir"}
