"""A container's environment as the kubelet computes it for ``subPathExpr``, and the
kubelet's ``$(VAR)`` expansion.

Each ``env`` entry in order: a ``value`` (itself expanded with the variables defined before
it), or ``valueFrom`` a ``fieldRef`` (the downward API, :mod:`kubevol.k8s.fieldpath`), a
``resourceFieldRef`` or a ``configMapKeyRef`` (``optional`` honoured). ``secretKeyRef`` is
refused for subPathExpr: the value would become part of a mount path, visible in the mount
table and in every message about the mount. ``envFrom`` is not read.

Expansion follows Kubernetes' ``third_party/forked/golang/expansion``: ``$(NAME)`` is
replaced, ``$$`` is a literal ``$``, anything else after ``$`` is kept as written. For a
subPathExpr every referenced variable must have a non-empty value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from kubevol.errors import SpecError
from kubevol.k8s.fieldpath import extract_field_path, extract_resource_value
from kubevol.k8s.objects import ConfigMap, ObjectNotFoundError
from kubevol.k8s.pod import Container, Pod

_OPERATOR = "$"
_OPENER = "("
_CLOSER = ")"


class ConfigMapKeyRef(Protocol):
    """A ``configMapKeyRef`` (``V1ConfigMapKeySelector``) of an environment variable."""

    @property
    def name(self) -> str | None: ...

    @property
    def key(self) -> str | None: ...

    @property
    def optional(self) -> bool | None: ...


def expand(text: str, mapping: Callable[[str], str]) -> str:
    """Kubernetes' ``expansion.Expand``: ``$(VAR)`` → ``mapping(VAR)``; ``$$`` → ``$``;
    an unclosed ``$(`` or ``$x`` stays as it is."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == _OPERATOR and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            read, is_var, advance = _read_variable(text[cursor + 1:])
            out.append(mapping(read) if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def _read_variable(rest: str) -> tuple[str, bool, int]:
    if rest[0] == _OPERATOR:
        return _OPERATOR, False, 1
    if rest[0] == _OPENER:
        close = rest.find(_CLOSER, 1)
        if close != -1:
            return rest[1:close], True, close + 1
        return _OPERATOR + _OPENER, False, 1
    return _OPERATOR + rest[0], False, 1


def expand_with(env: Mapping[str, str]) -> Callable[[str], str]:
    """A mapping for :func:`expand` that leaves unknown ``$(VAR)`` references as written."""
    return lambda name: env.get(name, f"{_OPERATOR}{_OPENER}{name}{_CLOSER}")


def container_env(
    pod: Pod,
    container: Container,
    *,
    node_name: str,
    host_ip: str,
    node_allocatable: Mapping[str, str],
    get_config_map: Callable[[str, str], ConfigMap] | None = None,
) -> dict[str, str]:
    """The variables of ``container`` (a ``V1Container`` of the ``V1Pod`` ``pod``).

    Raises :class:`~kubevol.errors.SpecError` naming the variable when one cannot be had.
    """
    env: dict[str, str] = {}
    namespace = str(getattr(pod.metadata, "namespace", None) or "default")
    for var in getattr(container, "env", None) or []:
        name = str(var.name)
        source = var.value_from
        if source is None:
            env[name] = expand(str(var.value or ""), expand_with(env))
            continue
        if source.field_ref is not None:
            env[name] = extract_field_path(pod, str(source.field_ref.field_path),
                                           node_name=node_name, host_ip=host_ip)
        elif source.resource_field_ref is not None:
            ref = source.resource_field_ref
            env[name] = extract_resource_value(
                ref, pod, str(ref.container_name or container.name), node_allocatable
            )
        elif source.config_map_key_ref is not None:
            ref = source.config_map_key_ref
            value = _config_map_value(get_config_map, namespace, ref, name)
            if value is not None:
                env[name] = value
        elif source.secret_key_ref is not None:
            raise SpecError(
                f"env var {name} of container {container.name} comes from a Secret: kubevol "
                "does not expand Secret values into subPathExpr (they would show in mount paths)"
            )
        else:
            raise SpecError(f"env var {name} of container {container.name} has an empty "
                            "valueFrom")
    return env


def _config_map_value(
    get_config_map: Callable[[str, str], ConfigMap] | None, namespace: str,
    ref: ConfigMapKeyRef, var: str,
) -> str | None:
    optional = bool(ref.optional)
    if get_config_map is None:
        raise SpecError(f"env var {var}: no source of ConfigMaps to read {namespace}/{ref.name}")
    try:
        config_map = get_config_map(namespace, str(ref.name))
    except ObjectNotFoundError:
        if optional:
            return None
        raise
    value = config_map.data.get(str(ref.key))
    if value is None:
        if optional:
            return None
        raise SpecError(f"couldn't find key {ref.key} in ConfigMap {namespace}/{ref.name}")
    return value


def expand_sub_path_expr(expr: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``ExpandContainerVolumeMounts``: every ``$(VAR)`` of ``expr`` must have
    a non-empty value, else SpecError naming the missing ones (sorted)."""
    missing: set[str] = set()

    def lookup(name: str) -> str:
        value = env.get(name, "")
        if not value:
            missing.add(name)
        return value

    expanded = expand(expr, lookup)
    if missing:
        raise SpecError(f"missing value for {', '.join(sorted(missing))}")
    return expanded
