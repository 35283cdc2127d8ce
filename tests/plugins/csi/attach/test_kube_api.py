"""Covers kubevol.testing.kube_api and kubevol.plugins.csi.driverinfo.

The stand-in API server answers the real kubernetes client as an API server would, and
CSIDriver objects are read from it (and from local YAML) as the plugin needs them."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kubevol.plugins.csi.driverinfo import (
    CSIDriverInfo,
    CSIDriverInfoError,
    FSGroupPolicy,
    KubernetesCSIDrivers,
    LocalCSIDrivers,
)
from kubevol.testing.kube_api import KubeAPIServer


def test_csidriver_crud_through_the_client(api: KubeAPIServer) -> None:
    """Create (defaulted like the API server), read, list and delete CSIDrivers with the
    kubernetes client; missing objects are 404 NotFound, duplicates 409 AlreadyExists."""
    storage = k8s.StorageV1Api(api.api_client())
    created = storage.create_csi_driver(
        k8s.V1CSIDriver(metadata=k8s.V1ObjectMeta(name="a.example.com"),
                        spec=k8s.V1CSIDriverSpec(pod_info_on_mount=True))
    )
    assert created.spec.fs_group_policy == "ReadWriteOnceWithFSType"
    assert created.spec.attach_required is True
    assert created.spec.volume_lifecycle_modes == ["Persistent"]
    assert storage.read_csi_driver("a.example.com").spec.pod_info_on_mount is True
    assert [d.metadata.name for d in storage.list_csi_driver().items] == ["a.example.com"]
    with pytest.raises(ApiException) as err:
        storage.create_csi_driver(created)
    assert err.value.status == 409
    storage.delete_csi_driver("a.example.com")
    with pytest.raises(ApiException) as err:
        storage.read_csi_driver("a.example.com")
    assert err.value.status == 404
    status = json.loads(err.value.body)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotFound", 404)
    assert status["message"] == 'csidrivers.storage.k8s.io "a.example.com" not found'
    assert ("DELETE", "/apis/storage.k8s.io/v1/csidrivers/a.example.com") in api.requests


def test_kubernetes_csidriver_source(api: KubeAPIServer) -> None:
    """KubernetesCSIDrivers returns V1CSIDriver objects, None for a 404, and a clear error for
    any other failure."""
    api.add_csidriver({"metadata": {"name": "a.example.com"},
                       "spec": {"attachRequired": False, "fsGroupPolicy": "File"}})
    source = KubernetesCSIDrivers(api.api_client())
    info = CSIDriverInfo.from_object(source("a.example.com"))
    assert (info.attach_required, info.fs_group_policy) == (False, FSGroupPolicy.FILE)
    assert source("missing.example.com") is None
    api.fail_next("GET", "/apis/storage.k8s.io/v1/csidrivers/a.example.com", 500)
    with pytest.raises(CSIDriverInfoError, match="500"):
        source("a.example.com")


def test_local_csidrivers_from_yaml() -> None:
    """Local YAML (documents or a List) gets the API server's defaults; other kinds and bad
    policies are refused naming the problem."""
    source = LocalCSIDrivers.from_yaml(
        """
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: a.example.com}
spec: {volumeLifecycleModes: [Persistent, Ephemeral]}
---
kind: List
items:
- kind: CSIDriver
  metadata: {name: b.example.com}
  spec: {attachRequired: false, podInfoOnMount: true}
"""
    )
    assert source.names() == ["a.example.com", "b.example.com"]
    a = CSIDriverInfo.from_object(source("a.example.com"))
    assert a.fs_group_policy is FSGroupPolicy.READ_WRITE_ONCE_WITH_FS_TYPE
    assert a.supports_lifecycle_mode("Ephemeral") and a.attach_required
    b = CSIDriverInfo.from_object(source("b.example.com"))
    assert (b.attach_required, b.pod_info_on_mount) == (False, True)
    assert source("c.example.com") is None
    with pytest.raises(CSIDriverInfoError, match="kind 'Pod'"):
        LocalCSIDrivers.from_yaml("kind: Pod\nmetadata: {name: x}\n")
    with pytest.raises(CSIDriverInfoError, match="fsGroupPolicy 'Sometimes'"):
        LocalCSIDrivers.from_yaml("kind: CSIDriver\nmetadata: {name: x}\n"
                                  "spec: {fsGroupPolicy: Sometimes}\n")
