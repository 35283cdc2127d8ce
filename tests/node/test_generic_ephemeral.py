"""Covers kubevol.node.manifests: generic ephemeral volumes.

Generic ephemeral volumes (issue 31, point 8): a pod volume with
``ephemeral.volumeClaimTemplate`` uses the claim named ``<pod name>-<volume name>``, and only
when the pod controls it (``k8s.io/component-helpers/storage/ephemeral``: ``VolumeClaimName``
and ``VolumeIsForPod``, whose error text the refusal repeats)."""

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

UID = "88888888-2222-3333-4444-555555555555"


def manifests(owner_uid: str | None, *, claim_name: str = "web-scratch") -> str:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "namespace": "shop", "uid": UID},
           "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": [
               {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                   "accessModes": ["ReadWriteOnce"],
                   "resources": {"requests": {"storage": "1Gi"}}}}}}]}}
    owners = [] if owner_uid is None else [{"apiVersion": "v1", "kind": "Pod", "name": "web",
                                            "uid": owner_uid, "controller": True,
                                            "blockOwnerDeletion": True}]
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": claim_name, "namespace": "shop", "ownerReferences": owners},
           "spec": {"volumeName": "pv-scratch", "accessModes": ["ReadWriteOnce"]}}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-scratch"},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                   "csi": {"driver": DRIVER_NAME, "volumeHandle": "vol-scratch"}}}
    return "\n---\n".join(json.dumps(o) for o in (pod, pvc, pv))


def up(tmp_path: Path, served: Served, text: str) -> int:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(text)
    return main(["up", "--root", str(tmp_path / "root"), "--node-name", "n1", "--timeout",
                 "10s", "--csi-driver", f"{DRIVER_NAME}={served.handle.address}",
                 str(manifest)])


@pytest.fixture
def driver(serve_driver: ServeFactory) -> Served:
    return serve_driver()


def test_the_pods_own_claim_is_used(tmp_path: Path, driver: Served) -> None:
    assert up(tmp_path, driver, manifests(UID)) == exits.OK
    (publish,) = driver.driver.requests("NodePublishVolume")
    assert publish["volume_id"] == "vol-scratch"
    assert publish["target_path"].endswith(
        f"/pods/{UID}/volumes/kubernetes.io~csi/pv-scratch/mount")
    record = json.loads((tmp_path / "root" / "kubevol" / "pods" / f"{UID}.json").read_text())
    assert "PersistentVolumeClaim" in [o["kind"] for o in record["objects"]]


@pytest.mark.parametrize("owner", [None, "99999999-2222-3333-4444-555555555555"])
def test_a_claim_the_pod_does_not_control_is_refused(
    tmp_path: Path, driver: Served, capsys: pytest.CaptureFixture[str], owner: str | None
) -> None:
    assert up(tmp_path, driver, manifests(owner)) != exits.OK
    assert ("PVC shop/web-scratch was not created for pod shop/web (pod is not owner)"
            in capsys.readouterr().err)
    assert driver.driver.requests("NodePublishVolume") == []


def test_a_missing_claim_is_named(
    tmp_path: Path, driver: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert up(tmp_path, driver, manifests(UID, claim_name="other")) != exits.OK
    assert "shop/web-scratch is not in the manifests" in capsys.readouterr().err
