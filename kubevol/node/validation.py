"""The checks the API server makes on the objects kubevol reads from manifests, for the parts
kubevol uses, before anything is recorded or mounted.

kubevol is its own API server when it runs pods from manifest files: what the API server
would refuse must be refused here, up front and in full, or it gets recorded and fails later,
on every run (an invalid volume name recorded first made every later ``up`` on the root
fail; a pod UID starting with "." was accepted but its record never read). The rules are
Kubernetes' (``pkg/apis/core/validation``): DNS-1123 names, volume names unique, fsGroup
within 0..2^31-1, quantities that parse, hostPath paths without ``..``; plus the shape
(mappings and lists where the code reads them) and what kubevol itself needs of a pod UID
(one file name under ``<root>/kubevol/pods/``, not hidden).

Each check raises :class:`~kubevol.errors.SpecError` naming the object and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubevol.errors import InvalidPathSegmentError, SpecError
from kubevol.layout import MAX_SEGMENT_BYTES, validate_path_segment
from kubevol.util import units

#: ``metadata.name`` of most objects, ``IsDNS1123Subdomain``.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_SUBDOMAIN_MAX = 253
#: Namespaces and volume names, ``IsDNS1123Label``.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_LABEL_MAX = 63
#: ``IsValidGroupID``: what libcontainer accepts.
_MAX_GROUP_ID = 2**31 - 1
#: A record is ``<uid>.json``: the UID must leave room for the suffix in a file name.
_RECORD_SUFFIX = ".json"
FS_GROUP_CHANGE_POLICIES = ("OnRootMismatch", "Always")
VOLUME_MODES = ("Filesystem", "Block")


def validate_pod_uid(uid: Any) -> str:
    """``uid`` if it can name a pod's directory and record, else SpecError: a path segment,
    not hidden (records and temporary files starting with "." are not read as records),
    short enough for ``<uid>.json``."""
    if not isinstance(uid, str):
        raise SpecError(f"pod UID must be a string, got {type(uid).__name__}")
    try:
        validate_path_segment(uid, "pod UID")
    except InvalidPathSegmentError as exc:
        raise SpecError(str(exc)) from exc
    if uid.startswith("."):
        raise SpecError(f"pod UID {uid!r} must not start with '.'")
    if len(uid.encode("utf-8", "surrogateescape")) + len(_RECORD_SUFFIX) > MAX_SEGMENT_BYTES:
        raise SpecError(
            f"pod UID is longer than {MAX_SEGMENT_BYTES - len(_RECORD_SUFFIX)} bytes"
        )
    return uid


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` when present and not null, checked to be of ``kind``; None if absent."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise SpecError(f"{where}.{key} must be {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise SpecError(f"{where}.{key} must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", int: "an integer"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _mappings(obj: Mapping[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    """``obj[key]``: a list of mappings (``[]`` when absent)."""
    items = _get(obj, key, list, where) or []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise SpecError(f"{where}.{key}[{i}] must be a mapping, got {type(item).__name__}")
    return items


def _name(value: Any, pattern: re.Pattern[str], limit: int, what: str) -> None:
    if not isinstance(value, str) or len(value) > limit or not pattern.fullmatch(value):
        raise SpecError(
            f"{what} {value!r} is not valid: at most {limit} lowercase letters, digits and "
            "'-' (names of several labels also '.'), starting and ending with a letter or "
            "digit"
        )


def _metadata(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    meta = _get(obj, "metadata", dict, where) or {}
    if meta.get("name") in (None, ""):
        raise SpecError(f"a {obj.get('kind', 'manifest')} in {where} has no metadata.name")
    _name(meta.get("name"), _DNS1123_SUBDOMAIN, _DNS1123_SUBDOMAIN_MAX, f"{where} name")
    if meta.get("namespace") is not None:
        _name(meta["namespace"], _DNS1123_LABEL, _DNS1123_LABEL_MAX, f"{where} namespace")
    if meta.get("uid") is not None:
        validate_pod_uid(meta["uid"])
    return meta


def _quantity(value: Any, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SpecError(f"{what} must be a quantity, got {type(value).__name__}")
    try:
        units.quantity_bytes(value)
    except (units.UnitError, ValueError) as exc:
        raise SpecError(f"{what} {value!r} is not a valid quantity: {exc}") from exc


def validate_pod(pod: Mapping[str, Any], where: str) -> None:
    """Raise SpecError unless pod manifest ``pod`` is one the API server would accept, as
    far as the fields kubevol reads go."""
    meta = _metadata(pod, where)
    where = f"{where}: pod {meta.get('namespace') or 'default'}/{meta['name']}"
    spec = _get(pod, "spec", dict, where) or {}
    context = _get(spec, "securityContext", dict, f"{where} spec") or {}
    fs_group = _get(context, "fsGroup", int, f"{where} spec.securityContext")
    if fs_group is not None and not 0 <= fs_group <= _MAX_GROUP_ID:
        raise SpecError(f"{where}: fsGroup {fs_group} is not within 0..{_MAX_GROUP_ID}")
    policy = _get(context, "fsGroupChangePolicy", str, f"{where} spec.securityContext")
    if policy is not None and policy not in FS_GROUP_CHANGE_POLICIES:
        raise SpecError(
            f"{where}: fsGroupChangePolicy {policy!r} is not one of {FS_GROUP_CHANGE_POLICIES}"
        )
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(_mappings(spec, key, f"{where} spec")):
            for use in ("volumeMounts", "volumeDevices"):
                for j, item in enumerate(_mappings(container, use, f"{where} {key}[{i}]")):
                    _get(item, "name", str, f"{where} {key}[{i}].{use}[{j}]")
    seen: set[str] = set()
    for volume in _mappings(spec, "volumes", f"{where} spec"):
        name = str(volume.get("name"))
        _name(volume.get("name"), _DNS1123_LABEL, _DNS1123_LABEL_MAX, f"{where} volume name")
        if name in seen:
            raise SpecError(f"{where}: volume name {name!r} is used twice")
        seen.add(name)
        _volume_source(volume, f"{where} volume {name}")


def _volume_source(volume: Mapping[str, Any], where: str) -> None:
    for key in volume:
        if key != "name":  # every other field is a source: an object in the API
            _get(volume, key, dict, where)
    claim = _get(volume, "persistentVolumeClaim", dict, where)
    if claim is not None and not isinstance(claim.get("claimName"), str):
        raise SpecError(f"{where}: persistentVolumeClaim.claimName must be a string")
    empty_dir = _get(volume, "emptyDir", dict, where)
    if empty_dir is not None:
        _quantity(empty_dir.get("sizeLimit"), f"{where}: emptyDir.sizeLimit")
    host_path = _get(volume, "hostPath", dict, where)
    if host_path is not None:
        path = host_path.get("path")
        if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
            raise SpecError(
                f"{where}: hostPath.path {path!r} must be an absolute path without '..'"
            )


def validate_persistent_volume(pv: Mapping[str, Any], where: str) -> None:
    """Raise SpecError unless PersistentVolume manifest ``pv`` has the shape kubevol reads."""
    meta = _metadata(pv, where)
    where = f"{where}: PersistentVolume {meta['name']}"
    spec = _get(pv, "spec", dict, where) or {}
    _get(spec, "claimRef", dict, f"{where} spec")
    capacity = _get(spec, "capacity", dict, f"{where} spec") or {}
    _quantity(capacity.get("storage"), f"{where}: capacity.storage")
    mode = _get(spec, "volumeMode", str, f"{where} spec")
    if mode is not None and mode not in VOLUME_MODES:
        raise SpecError(f"{where}: volumeMode {mode!r} is not one of {VOLUME_MODES}")


def validate_claim(pvc: Mapping[str, Any], where: str) -> None:
    """Raise SpecError unless PersistentVolumeClaim manifest ``pvc`` has the shape kubevol
    reads."""
    meta = _metadata(pvc, where)
    where = f"{where}: PersistentVolumeClaim {meta['name']}"
    spec = _get(pvc, "spec", dict, where) or {}
    _get(spec, "volumeName", str, f"{where} spec")
