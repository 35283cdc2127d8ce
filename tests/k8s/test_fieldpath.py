"""Covers kubevol.k8s.fieldpath.

Downward API values: field paths, Go quoting of labels and annotations, and resource
values divided and rounded up as the kubelet does."""

from __future__ import annotations

from typing import Any

import pytest

from kubevol.errors import SpecError
from kubevol.k8s.fieldpath import (
    extract_field_path,
    extract_resource_value,
    format_map,
    go_quote,
)
from kubevol.spec import api_object


def pod(**overrides: Any) -> Any:
    data: dict[str, Any] = {
        "metadata": {"name": "web", "namespace": "prod", "uid": "u-1",
                     "labels": {"b": "2", "a": "x y"}, "annotations": {"note": 'say "hi"\n'}},
        "spec": {
            "serviceAccountName": "app",
            "containers": [{"name": "c", "resources": {
                "limits": {"cpu": "1500m", "memory": "1Gi"},
                "requests": {"cpu": "250m", "memory": "100M", "ephemeral-storage": "1.5"},
            }}],
            "initContainers": [{"name": "init"}],
        },
    }
    data.update(overrides)
    return api_object("V1Pod", data)


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("plain", '"plain"'),
        ('q"b\\', '"q\\"b\\\\"'),
        ("tab\tnl\n", '"tab\\tnl\\n"'),
        ("\x07\x1b", '"\\a\\x1b"'),
        ("héllo ☃", '"héllo ☃"'),
        ("\u00ad\u2028", '"\\u00ad\\u2028"'),
        ("\U000e0001", '"\\U000e0001"'),
    ],
)
def test_go_quote(text: str, quoted: str) -> None:
    """Go's strconv.Quote: printable runes kept, others escaped with lower-case hex."""
    assert go_quote(text) == quoted


def test_labels_and_annotations_are_sorted_quoted_lines() -> None:
    """``key="value"`` lines, sorted, no trailing newline."""
    assert extract_field_path(pod(), "metadata.labels") == 'a="x y"\nb="2"'
    assert extract_field_path(pod(), "metadata.annotations") == 'note="say \\"hi\\"\\n"'
    assert format_map({}) == ""


def test_metadata_and_runtime_fields() -> None:
    """Metadata, one label by key, spec and status fields (node values when unknown)."""
    p = pod()
    assert extract_field_path(p, "metadata.name") == "web"
    assert extract_field_path(p, "metadata.namespace") == "prod"
    assert extract_field_path(p, "metadata.uid") == "u-1"
    assert extract_field_path(p, "metadata.labels['a']") == "x y"
    assert extract_field_path(p, "metadata.annotations['missing']") == ""
    assert extract_field_path(p, "spec.serviceAccountName") == "app"
    assert extract_field_path(p, "spec.nodeName", node_name="node-1") == "node-1"
    assert extract_field_path(p, "status.hostIP", host_ip="10.0.0.1") == "10.0.0.1"
    assert extract_field_path(p, "status.podIP") == ""
    with_status = pod(status={"podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}],
                              "hostIP": "10.0.0.9"})
    assert extract_field_path(with_status, "status.podIP") == "10.1.0.5"
    assert extract_field_path(with_status, "status.podIPs") == "10.1.0.5,fd00::5"
    assert extract_field_path(with_status, "status.hostIP", host_ip="x") == "10.0.0.9"
    with pytest.raises(SpecError, match=r"unsupported fieldPath: spec.bogus"):
        extract_field_path(p, "spec.bogus")


def ref(resource: str, divisor: str | None = None, container: str = "c") -> Any:
    return api_object("V1ResourceFieldSelector",
                      {"resource": resource, "containerName": container,
                       **({"divisor": divisor} if divisor else {})})


ALLOCATABLE = {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi"}


@pytest.mark.parametrize(
    ("resource", "divisor", "value"),
    [
        ("limits.cpu", None, "2"),            # 1.5 cores rounded up
        ("limits.cpu", "1m", "1500"),
        ("requests.cpu", "100m", "3"),        # 2.5 → 3
        ("limits.memory", None, str(1 << 30)),
        ("limits.memory", "1Mi", "1024"),
        ("requests.memory", "1Mi", "96"),     # 95.37 MiB → 96
        ("requests.ephemeral-storage", None, "2"),  # 1.5 bytes → Value() 2
        ("limits.ephemeral-storage", "1Gi", "100"),  # unset: node allocatable
    ],
)
def test_resource_values_round_up(resource: str, divisor: str | None, value: str) -> None:
    """Divided by the divisor and rounded up; unset limits from node allocatable."""
    assert extract_resource_value(ref(resource, divisor), pod(), "c", ALLOCATABLE) == value


def test_unset_cpu_limit_is_the_node_allocatable() -> None:
    """The init container has no limits: the node's CPUs are its limit."""
    assert extract_resource_value(ref("limits.cpu", container="init"), pod(), "init",
                                  ALLOCATABLE) == "4"
    assert extract_resource_value(ref("requests.cpu", container="init"), pod(), "init",
                                  ALLOCATABLE) == "0"


def test_resource_errors() -> None:
    """Unknown container or resource: the kubelet's messages."""
    with pytest.raises(SpecError, match="container nope not found"):
        extract_resource_value(ref("limits.cpu", container="nope"), pod(), "nope", ALLOCATABLE)
    with pytest.raises(SpecError, match=r"unsupported container resource : limits.gpu"):
        extract_resource_value(ref("limits.gpu"), pod(), "c", ALLOCATABLE)
