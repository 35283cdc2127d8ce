"""The downward API: a pod's own fields and its containers' resources as text, formatted
exactly as the kubelet writes them into downwardAPI volumes and environment variables.

``metadata.labels`` and ``metadata.annotations`` become sorted ``key="value"`` lines (Go's
``%q`` quoting); ``resourceFieldRef`` values are divided by their ``divisor`` and rounded up
(CPU in millicores first), with unset limits taken from the node's allocatable resources.
Pods are ``kubernetes.client.V1Pod`` objects.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Protocol

from kubevol.errors import SpecError
from kubevol.k8s.pod import Container, Pod, PodMetadata, pod_containers
from kubevol.util.units import UnitError, quantity_value

_SUBSCRIPTED = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")

_GO_ESCAPES = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
    "\v": "\\v", "\\": "\\\\", '"': '\\"',
}


def go_quote(text: str) -> str:
    """Go's ``strconv.Quote``: double quotes, C-like escapes, ``\\u``/``\\U`` for runes that
    are not printable (printable means letters, marks, numbers, punctuation, symbols and
    the ASCII space, as Go's ``unicode.IsPrint``)."""
    out = ['"']
    for ch in text:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x80:
                out.append(f"\\x{code:02x}")
            elif 0xD800 <= code <= 0xDFFF:  # a lone surrogate is invalid UTF-8 in Go
                out.append("\\ufffd")
            elif code < 0x10000:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def format_map(values: Mapping[str, str] | None) -> str:
    """``key="value"`` lines sorted by key, without a final newline (``fieldpath.FormatMap``)."""
    items = dict(values or {})
    return "\n".join(f"{k}={go_quote(items[k])}" for k in sorted(items))


def _meta(pod: Pod) -> PodMetadata:
    meta: PodMetadata | None = getattr(pod, "metadata", None)
    if meta is None:
        raise SpecError("the pod has no metadata")
    return meta


def extract_field_path(
    pod: Pod, field_path: str, *, node_name: str = "", host_ip: str = ""
) -> str:
    """The value of ``field_path`` for ``pod`` as the kubelet renders it.

    Metadata (``metadata.name``, ``namespace``, ``uid``, ``labels``, ``annotations`` and
    ``metadata.labels['k']``/``metadata.annotations['k']``) comes from the pod;
    ``spec.nodeName`` from the pod or else ``node_name`` (the pod runs here);
    ``spec.serviceAccountName``; ``status.hostIP``/``hostIPs`` from the pod or else
    ``host_ip``; ``status.podIP``/``podIPs`` from the pod (empty when unknown). Anything
    else raises :class:`~kubevol.errors.SpecError` (``unsupported fieldPath``).
    """
    meta = _meta(pod)
    spec = getattr(pod, "spec", None)
    status = getattr(pod, "status", None)
    match = _SUBSCRIPTED.match(field_path)
    if match is not None:
        values = getattr(meta, match.group(1)) or {}
        return str(values.get(match.group(2), ""))
    if field_path == "metadata.annotations":
        return format_map(meta.annotations)
    if field_path == "metadata.labels":
        return format_map(meta.labels)
    if field_path == "metadata.name":
        return str(meta.name or "")
    if field_path == "metadata.namespace":
        return str(meta.namespace or "default")
    if field_path == "metadata.uid":
        return str(meta.uid or "")
    if field_path == "spec.nodeName":
        return str(getattr(spec, "node_name", None) or node_name)
    if field_path == "spec.serviceAccountName":
        return str(getattr(spec, "service_account_name", None) or "")
    if field_path in ("status.hostIP", "status.hostIPs"):
        single = getattr(status, "host_ip", None)
        if field_path == "status.hostIP" and single:
            return str(single)
        ips = _ips(status, "host")
        if ips:
            return ips[0] if field_path == "status.hostIP" else ",".join(ips)
        return host_ip
    if field_path in ("status.podIP", "status.podIPs"):
        ips = _ips(status, "pod")
        single = getattr(status, "pod_ip", None)
        if not ips and single:
            ips = [str(single)]
        if field_path == "status.podIP":
            return ips[0] if ips else ""
        return ",".join(ips)
    raise SpecError(f"unsupported fieldPath: {field_path}")


def _ips(status: object, whose: str) -> list[str]:
    # Newer clients name the field ``pod_ips``, older ones ``pod_i_ps``.
    found = getattr(status, f"{whose}_ips", None) or getattr(status, f"{whose}_i_ps", None)
    return [str(i.ip) for i in found or [] if getattr(i, "ip", None)]


def _quantity(value: object, what: str) -> Decimal:
    try:
        return quantity_value(value)
    except UnitError as exc:
        raise SpecError(f"{what}: {exc}") from exc


def _ceil_int(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def find_container(pod: Pod, name: str) -> Container:
    """The container (or init container) of ``pod`` named ``name``; SpecError if none."""
    for container in pod_containers(pod):
        if container.name == name:
            return container
    raise SpecError(f"container {name} not found")


class ResourceFieldRef(Protocol):
    """A ``resourceFieldRef`` (``V1ResourceFieldSelector``) of a downward-API item or an
    environment variable: the resource (``limits.cpu``) and its divisor (a quantity)."""

    @property
    def resource(self) -> str | None: ...

    @property
    def divisor(self) -> object: ...


#: Limits that default to the node's allocatable amount when a container sets none.
_ALLOCATABLE_DEFAULTS = ("cpu", "memory", "ephemeral-storage")


def extract_resource_value(
    resource_field_ref: ResourceFieldRef, pod: Pod, container_name: str,
    node_allocatable: Mapping[str, str],
) -> str:
    """A ``resourceFieldRef`` (``limits.cpu``, ``requests.memory``, ``limits.hugepages-2Mi``,
    ...) of container ``container_name``, divided by its divisor (default 1), rounded up.

    CPU is compared in millicores (``ceil(milli / divisor_milli)``), other resources in
    units; the division is done in floating point as the kubelet does. A limit the
    container does not set is the node's allocatable amount.
    """
    container = find_container(pod, container_name)
    resource = str(resource_field_ref.resource or "")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise SpecError(f"unsupported container resource : {resource}")
    if name not in ("cpu", "memory", "ephemeral-storage") and not name.startswith("hugepages-"):
        raise SpecError(f"unsupported container resource : {resource}")
    resources = getattr(container, "resources", None)
    amounts = dict(getattr(resources, kind, None) or {})
    if kind == "limits" and name in _ALLOCATABLE_DEFAULTS and not amounts.get(name) \
            and node_allocatable.get(name):
        amounts[name] = node_allocatable[name]
    amount = _quantity(amounts.get(name) or "0", resource)
    divisor_text = resource_field_ref.divisor
    divisor = _quantity(divisor_text, "divisor") if divisor_text not in (None, "") else None
    if divisor is None or divisor == 0:
        divisor = Decimal(1)
    if name == "cpu":
        numerator, denominator = _ceil_int(amount * 1000), _ceil_int(divisor * 1000)
    else:
        numerator, denominator = _ceil_int(amount), _ceil_int(divisor)
    return str(math.ceil(float(numerator) / float(denominator)))
