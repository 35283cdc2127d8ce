"""Covers kubevol.node.manifests and kubevol.plugins.csi.driverinfo: local CSIDrivers.

CSIDriver objects on a node without an API server (issue 31, point 4): ``kubevol up``
accepts ``kind: CSIDriver`` in its manifests, the pod's record keeps the objects of the
drivers its volumes use, and the kubelet's rules read them: an inline (ephemeral) CSI volume
runs only when its driver's object allows ``Ephemeral``, and ``podInfoOnMount`` hands the
driver the pod's identity (the keys ``pkg/volume/csi/csi_mounter.go`` sets). A bad object is
refused before anything is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.testing.csi_driver import DRIVER_NAME
from tests.csi.support import Served, ServeFactory

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

UID = "77777777-2222-3333-4444-555555555555"

POD = f"""---
apiVersion: v1
kind: Pod
metadata: {{name: inline, namespace: shop, uid: {UID}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes:
  - name: scratch
    csi: {{driver: {DRIVER_NAME}, volumeAttributes: {{size: 1Mi}}}}
"""


def csidriver(**spec: object) -> str:
    return "---\n" + json.dumps({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER_NAME}, "spec": spec,
    }) + "\n"


def up(root: Path, served: Served, manifest: Path) -> int:
    return main(["up", "--root", str(root), "--node-name", "n1", "--timeout", "10s",
                 "--csi-driver", f"{DRIVER_NAME}={served.handle.address}", str(manifest)])


@pytest.fixture
def driver(serve_driver: ServeFactory) -> Served:
    return serve_driver()


def test_an_inline_volume_runs_with_its_drivers_object_and_gets_the_pods_identity(
    tmp_path: Path, driver: Served
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(csidriver(attachRequired=False, podInfoOnMount=True,
                                  volumeLifecycleModes=["Ephemeral"]) + POD)
    assert up(tmp_path / "root", driver, manifest) == exits.OK
    (publish,) = driver.driver.requests("NodePublishVolume")
    context = publish["volume_context"]
    assert context["csi.storage.k8s.io/ephemeral"] == "true"
    assert context["csi.storage.k8s.io/pod.name"] == "inline"
    assert context["csi.storage.k8s.io/pod.namespace"] == "shop"
    assert context["csi.storage.k8s.io/pod.uid"] == UID
    assert context["size"] == "1Mi"
    record = json.loads((tmp_path / "root" / "kubevol" / "pods" / f"{UID}.json").read_text())
    kinds = [o["kind"] for o in record["objects"]]
    assert "CSIDriver" in kinds, kinds


def test_without_the_object_the_inline_volume_is_refused(
    tmp_path: Path, driver: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD)
    assert up(tmp_path / "root", driver, manifest) == exits.FAILED
    assert driver.driver.requests("NodePublishVolume") == []
    assert "Ephemeral" in capsys.readouterr().err


@pytest.mark.parametrize(("spec", "named"), [
    ({"fsGroupPolicy": "Sometimes"}, "fsGroupPolicy"),
    ({"volumeLifecycleModes": ["Ephemerall"]}, "volumeLifecycleModes"),
])
def test_a_bad_object_is_refused_before_anything_is_recorded(
    tmp_path: Path, driver: Served, capsys: pytest.CaptureFixture[str],
    spec: dict[str, object], named: str,
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(csidriver(**spec) + POD)
    assert up(tmp_path / "root", driver, manifest) != exits.OK
    assert named in capsys.readouterr().err
    assert not (tmp_path / "root" / "kubevol" / "pods" / f"{UID}.json").exists()
    assert driver.driver.requests("NodePublishVolume") == []
