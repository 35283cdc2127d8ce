"""Covers kubevol.k8s.podenv.

Container environments and the kubelet's ``$(VAR)`` expansion for subPathExpr.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubevol.errors import SpecError
from kubevol.k8s.objects import ManifestObjects, ObjectNotFoundError
from kubevol.k8s.podenv import container_env, expand, expand_sub_path_expr, expand_with
from kubevol.spec import api_object


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)/$(B)", "1/2"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("$(A", "$(A"),
        ("x$", "x$"),
        ("$x$(A)", "$x1"),
        ("$(UNKNOWN)", "$(UNKNOWN)"),
        ("", ""),
    ],
)
def test_expand_like_kubernetes(text: str, expanded: str) -> None:
    """Escapes, unclosed references and unknown names as Kubernetes' expansion does."""
    assert expand(text, expand_with({"A": "1", "B": "2"})) == expanded


def pod(env: list[dict[str, Any]]) -> Any:
    return api_object("V1Pod", {
        "metadata": {"name": "web", "namespace": "prod", "uid": "u-1",
                     "labels": {"app": "web"}},
        "spec": {"serviceAccountName": "sa", "containers": [
            {"name": "c", "env": env, "resources": {"limits": {"memory": "64Mi"}}}]},
    })


def env_of(p: Any, objects: ManifestObjects | None = None) -> dict[str, str]:
    return container_env(
        p, p.spec.containers[0], node_name="node-1", host_ip="10.0.0.1",
        node_allocatable={"cpu": "2"},
        get_config_map=objects.get_config_map if objects is not None else None,
    )


def test_container_env_in_order_with_downward_fields() -> None:
    """Values expand earlier variables; fieldRef and resourceFieldRef values are computed."""
    p = pod([
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                           "divisor": "1Mi"}}},
        {"name": "DIR", "value": "logs/$(POD)-$(LATER)"},
        {"name": "LATER", "value": "x"},
    ])
    assert env_of(p) == {"POD": "web", "NODE": "node-1", "MEM": "64",
                         "DIR": "logs/web-$(LATER)", "LATER": "x"}


def test_config_map_refs_and_secret_refs() -> None:
    """configMapKeyRef is read (optional honoured); secretKeyRef is refused."""
    objects = ManifestObjects([{"kind": "ConfigMap", "metadata": {"name": "cfg",
                                                                 "namespace": "prod"},
                                "data": {"dir": "data"}}])
    p = pod([{"name": "D", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "dir"}}},
             {"name": "O", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k",
                                                             "optional": True}}}])
    assert env_of(p, objects) == {"D": "data"}
    missing = pod([{"name": "M", "valueFrom": {"configMapKeyRef": {"name": "nope",
                                                                   "key": "k"}}}])
    with pytest.raises(ObjectNotFoundError):
        env_of(missing, objects)
    secret = pod([{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
    with pytest.raises(SpecError, match="comes from a Secret"):
        env_of(secret, objects)


def test_sub_path_expr_needs_every_value() -> None:
    """Missing or empty variables are all named, sorted."""
    assert expand_sub_path_expr("logs/$(POD)", {"POD": "web"}) == "logs/web"
    with pytest.raises(SpecError, match=r"^missing value for A, B$"):
        expand_sub_path_expr("$(B)/$(A)/$(C)", {"C": "c", "A": ""})
