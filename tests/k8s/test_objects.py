"""Covers kubevol.k8s.objects.

API object sources: manifests beside the pods, and a real API server through the
``kubernetes`` client (the stand-in server), with the kubelet's not-found errors."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from kubevol.errors import SpecError
from kubevol.k8s.objects import (
    KubeAPIObjects,
    ManifestObjects,
    NoObjects,
    ObjectNotFoundError,
    ObjectSourceError,
    Secret,
)
from kubevol.testing.kube_api import KubeAPIServer

CANARY = "canary-s3cr3t-value"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_manifest_objects_by_namespace_and_name() -> None:
    """ConfigMaps and Secrets from dicts; namespace defaults to ``default``."""
    objects = ManifestObjects([
        {"kind": "ConfigMap", "metadata": {"name": "app"}, "data": {"k": "v"},
         "binaryData": {"bin": b64("\x00\x01")}},
        {"kind": "Secret", "metadata": {"name": "creds", "namespace": "prod"},
         "data": {"user": b64("admin")}, "stringData": {"pass": "pw"}},
    ])
    cm = objects.get_config_map("default", "app")
    assert cm.items() == {"k": b"v", "bin": b"\x00\x01"}
    secret = objects.get_secret("prod", "creds")
    assert secret.items() == {"user": b"admin", "pass": b"pw"}
    with pytest.raises(ObjectNotFoundError, match=r'^configmap "app" not found$'):
        objects.get_config_map("prod", "app")
    with pytest.raises(ObjectNotFoundError, match=r'^secret "nope" not found$'):
        objects.get_secret("prod", "nope")


def test_secret_values_never_show() -> None:
    """Neither repr nor a bad-base64 error shows the value."""
    secret = Secret(namespace="ns", name="s", data={"k": b64(CANARY)})
    assert CANARY not in repr(secret) and b64(CANARY) not in repr(secret)
    with pytest.raises(SpecError) as info:
        ManifestObjects([{"kind": "Secret", "metadata": {"name": "s"},
                          "data": {"k": CANARY + "!!"}}])
    assert CANARY not in str(info.value)
    assert "'k'" in str(info.value)
    with pytest.raises(SpecError) as info:
        ManifestObjects([{"kind": "Secret", "metadata": {"name": "s"},
                          "stringData": {"k": [CANARY]}}])
    assert CANARY not in str(info.value)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "ConfigMap", "metadata": {}}, "no metadata.name"),
        ({"kind": "ConfigMap", "metadata": {"name": "x"}, "data": ["a"]}, "must be a mapping"),
        ({"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1"},
          "binaryData": {"a": b64("1")}}, "in both data and binaryData"),
        ({"kind": "Pod", "metadata": {"name": "x"}}, "expected a ConfigMap or Secret"),
    ],
)
def test_bad_manifests_are_refused(obj: dict[str, object], message: str) -> None:
    """A malformed object is a SpecError naming what is wrong."""
    with pytest.raises(SpecError, match=message):
        ManifestObjects([obj], where="pods.yaml")


def test_no_objects_says_what_to_configure() -> None:
    """Without a source, a read says to give manifests or an API server."""
    with pytest.raises(ObjectSourceError, match="--kubeconfig"):
        NoObjects().get_secret("ns", "s")


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        yield server


def test_api_objects_read_with_the_api_semantics(api: KubeAPIServer) -> None:
    """Objects come through the real client; 404 is ObjectNotFoundError."""
    api.add_config_map("ns", "app", {"k": "v"}, binary_data={"b": b"\xff"})
    api.add_secret("ns", "creds", {"token": CANARY})
    objects = KubeAPIObjects(api.api_client())
    assert objects.get_config_map("ns", "app").items() == {"k": b"v", "b": b"\xff"}
    assert objects.get_secret("ns", "creds").value("token") == CANARY.encode()
    with pytest.raises(ObjectNotFoundError, match=r'^configmap "other" not found$'):
        objects.get_config_map("ns", "other")
    with pytest.raises(ObjectNotFoundError):
        objects.get_secret("elsewhere", "creds")


def test_api_errors_other_than_404_are_not_missing(api: KubeAPIServer) -> None:
    """A 500 is an ObjectSourceError with the status, not a missing object."""
    api.add_config_map("ns", "app", {"k": "v"})
    api.fail_next("GET", "/api/v1/namespaces/ns/configmaps/app", 500)
    with pytest.raises(ObjectSourceError, match="500"):
        KubeAPIObjects(api.api_client()).get_config_map("ns", "app")


def test_unreachable_api_server_is_a_source_error() -> None:
    """A dead API server is reported, not taken for a missing object."""
    from kubernetes.client import ApiClient, Configuration

    config = Configuration()
    config.host = "http://127.0.0.1:9"  # discard port: nothing listens
    config.retries = 0
    with pytest.raises(ObjectSourceError, match="cannot reach"):
        KubeAPIObjects(ApiClient(config)).get_secret("ns", "s")
