"""The checks the API server makes on the objects kubevol reads from manifests, for the parts
kubevol uses, before anything is recorded or mounted.

kubevol is its own API server when it runs pods from manifest files: what the API server
would refuse must be refused here, up front and in full, or it gets recorded and fails later,
on every run (an invalid volume name recorded first made every later ``up`` on the root
fail; a pod UID starting with "." was accepted but its record never read). The rules are
Kubernetes' (``pkg/apis/core/validation``): DNS-1123 names, volume names unique, fsGroup
within 0..2^31-1, quantities that parse, hostPath paths without ``..``; the file modes of
configMap, secret, downwardAPI and projected volumes within 0..0777 (a mode beyond would
write setuid, setgid or sticky files), their item keys and paths (relative, no ``..``
element, not starting with ``..``: the atomic writer's own names), a projected volume's
sources (one kind each, no path twice, a token's lifetime), and relative subPaths without
``..``; plus the shape (mappings and lists where the code reads them) and what kubevol itself
needs of a pod UID (one file name under ``<root>/kubevol/pods/``, not hidden).

A payload path and a subPath are checked by the functions the volume set-up uses
(:func:`~kubevol.plugins.atomic_writer.validate_payload_path`,
:func:`~kubevol.mount.subpath.validate_sub_path`): what passes here passes there (a
subPathExpr is checked as written here, and again once expanded).

Each check raises :class:`~kubevol.errors.SpecError` naming the object and the field.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from kubevol.errors import InvalidPathSegmentError, InvalidPayloadPathError, SpecError
from kubevol.layout import MAX_SEGMENT_BYTES, validate_path_segment
from kubevol.mount.subpath import SubPathError, validate_sub_path
from kubevol.plugins.atomic_writer import validate_payload_path
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
#: The modes of projected files (``fileModeErrorMsg``): permission bits only.
_MAX_FILE_MODE = 0o777
_FILE_MODE_RULE = "must be a number between 0 and 0777 (octal), both inclusive"
#: A projected service-account token's ``expirationSeconds``: 10 minutes to 2^32 seconds.
_MIN_TOKEN_SECONDS = 10 * 60
_MAX_TOKEN_SECONDS = 2**32
#: The kinds of a projected volume's sources, one per source.
_PROJECTIONS = ("secret", "configMap", "downwardAPI", "serviceAccountToken",
                "clusterTrustBundle")
FS_GROUP_CHANGE_POLICIES = ("OnRootMismatch", "Always")
VOLUME_MODES = ("Filesystem", "Block")


def validate_pod_uid(uid: object) -> str:
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


def _get(obj: Mapping[str, object], key: str, kind: type | tuple[type, ...], where: str) -> object:
    """``obj[key]`` when present and not null, checked to be of ``kind``; None if absent."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise SpecError(f"{where}.{key} must be {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise SpecError(f"{where}.{key} must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _mapping(obj: Mapping[str, object], key: str, where: str) -> Mapping[str, object] | None:
    """``obj[key]``: a mapping, or None when absent (:func:`_get`)."""
    value = _get(obj, key, dict, where)
    return value if isinstance(value, dict) else None


def _string(obj: Mapping[str, object], key: str, where: str) -> str | None:
    """``obj[key]``: a string, or None when absent (:func:`_get`)."""
    value = _get(obj, key, str, where)
    return value if isinstance(value, str) else None


def _integer(obj: Mapping[str, object], key: str, where: str) -> int | None:
    """``obj[key]``: an integer (not a boolean), or None when absent (:func:`_get`)."""
    value = _get(obj, key, int, where)
    return value if isinstance(value, int) else None


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", int: "an integer"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _mappings(obj: Mapping[str, object], key: str, where: str) -> list[Mapping[str, object]]:
    """``obj[key]``: a list of mappings (``[]`` when absent)."""
    value = _get(obj, key, list, where)
    items: list[Mapping[str, object]] = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        if not isinstance(item, dict):
            raise SpecError(f"{where}.{key}[{i}] must be a mapping, got {type(item).__name__}")
        items.append(item)
    return items


def _name(value: object, pattern: re.Pattern[str], limit: int, what: str) -> None:
    if not isinstance(value, str) or len(value) > limit or not pattern.fullmatch(value):
        raise SpecError(
            f"{what} {value!r} is not valid: at most {limit} lowercase letters, digits and "
            "'-' (names of several labels also '.'), starting and ending with a letter or "
            "digit"
        )


def _metadata(obj: Mapping[str, object], where: str) -> Mapping[str, object]:
    meta = _mapping(obj, "metadata", where) or {}
    if meta.get("name") in (None, ""):
        raise SpecError(f"a {obj.get('kind', 'manifest')} in {where} has no metadata.name")
    _name(meta.get("name"), _DNS1123_SUBDOMAIN, _DNS1123_SUBDOMAIN_MAX, f"{where} name")
    if meta.get("namespace") is not None:
        _name(meta["namespace"], _DNS1123_LABEL, _DNS1123_LABEL_MAX, f"{where} namespace")
    if meta.get("uid") is not None:
        validate_pod_uid(meta["uid"])
    return meta


def _quantity(value: object, what: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SpecError(f"{what} must be a quantity, got {type(value).__name__}")
    try:
        units.quantity_bytes(value)
    except (units.UnitError, ValueError) as exc:
        raise SpecError(f"{what} {value!r} is not a valid quantity: {exc}") from exc


def validate_pod(pod: Mapping[str, object], where: str) -> None:
    """Raise SpecError unless pod manifest ``pod`` is one the API server would accept, as
    far as the fields kubevol reads go."""
    meta = _metadata(pod, where)
    where = f"{where}: pod {meta.get('namespace') or 'default'}/{meta['name']}"
    spec = _mapping(pod, "spec", where) or {}
    context = _mapping(spec, "securityContext", f"{where} spec") or {}
    fs_group = _integer(context, "fsGroup", f"{where} spec.securityContext")
    if fs_group is not None and not 0 <= fs_group <= _MAX_GROUP_ID:
        raise SpecError(f"{where}: fsGroup {fs_group} is not within 0..{_MAX_GROUP_ID}")
    policy = _string(context, "fsGroupChangePolicy", f"{where} spec.securityContext")
    if policy is not None and policy not in FS_GROUP_CHANGE_POLICIES:
        raise SpecError(
            f"{where}: fsGroupChangePolicy {policy!r} is not one of {FS_GROUP_CHANGE_POLICIES}"
        )
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(_mappings(spec, key, f"{where} spec")):
            for use in ("volumeMounts", "volumeDevices"):
                for j, item in enumerate(_mappings(container, use, f"{where} {key}[{i}]")):
                    _string(item, "name", f"{where} {key}[{i}].{use}[{j}]")
                    if use == "volumeMounts":
                        _sub_paths(item, f"{where} {key}[{i}].{use}[{j}]")
    seen: set[str] = set()
    for volume in _mappings(spec, "volumes", f"{where} spec"):
        name = str(volume.get("name"))
        _name(volume.get("name"), _DNS1123_LABEL, _DNS1123_LABEL_MAX, f"{where} volume name")
        if name in seen:
            raise SpecError(f"{where}: volume name {name!r} is used twice")
        seen.add(name)
        _volume_source(volume, f"{where} volume {name}")


#: The fields of a pod's volume besides ``name``: its sources (core/v1 ``Volume``).
VOLUME_SOURCES = frozenset({
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi",
    "downwardAPI", "emptyDir", "ephemeral", "fc", "flexVolume", "flocker",
    "gcePersistentDisk", "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs",
    "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume", "projected",
    "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume",
})


def _volume_source(volume: Mapping[str, object], where: str) -> None:
    for key in volume:
        if key == "name":
            continue
        if key not in VOLUME_SOURCES:
            # The API server's strict decoding refuses it likewise (kubectl: unknown field).
            close = difflib.get_close_matches(str(key), VOLUME_SOURCES, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise SpecError(f'{where}: unknown field "{key}" in a volume{hint}')
        _mapping(volume, key, where)  # every source is an object in the API
    claim = _mapping(volume, "persistentVolumeClaim", where)
    if claim is not None and not isinstance(claim.get("claimName"), str):
        raise SpecError(f"{where}: persistentVolumeClaim.claimName must be a string")
    empty_dir = _mapping(volume, "emptyDir", where)
    if empty_dir is not None:
        _quantity(empty_dir.get("sizeLimit"), f"{where}: emptyDir.sizeLimit")
    host_path = _mapping(volume, "hostPath", where)
    if host_path is not None:
        path = host_path.get("path")
        if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
            raise SpecError(
                f"{where}: hostPath.path {path!r} must be an absolute path without '..'"
            )
    config_map = _mapping(volume, "configMap", where)
    if config_map is not None:
        _mode(config_map, "defaultMode", f"{where}: configMap")
        _key_paths(config_map, "name", f"{where}: configMap")
    secret = _mapping(volume, "secret", where)
    if secret is not None:
        _mode(secret, "defaultMode", f"{where}: secret")
        _key_paths(secret, "secretName", f"{where}: secret")
    downward_api = _mapping(volume, "downwardAPI", where)
    if downward_api is not None:
        _mode(downward_api, "defaultMode", f"{where}: downwardAPI")
        _downward_api_files(downward_api, f"{where}: downwardAPI")
    projected = _mapping(volume, "projected", where)
    if projected is not None:
        _projected(projected, f"{where}: projected")


def _sub_paths(mount: Mapping[str, object], where: str) -> None:
    """``ValidateVolumeMounts``' subPath rules (``validateLocalDescendingPath``): a relative
    ``subPath`` or ``subPathExpr`` (checked before expansion) without a ``..`` element, not
    both."""
    sub_path = _string(mount, "subPath", where)
    expr = _string(mount, "subPathExpr", where)
    if sub_path and expr:
        raise SpecError(f"{where}: subPathExpr and subPath are mutually exclusive")
    for key, value in (("subPath", sub_path), ("subPathExpr", expr)):
        if value:
            try:
                validate_sub_path(value)
            except SubPathError as exc:
                raise SpecError(f"{where}.{key}: {exc}") from exc


def _mode(obj: Mapping[str, object], key: str, where: str) -> None:
    """A file mode (``defaultMode``, ``items[].mode``), when given, within 0..0777."""
    mode = _integer(obj, key, where)
    if mode is not None and not 0 <= mode <= _MAX_FILE_MODE:
        raise SpecError(f"{where}.{key} {mode} ({oct(mode)}) is not valid: {_FILE_MODE_RULE}")


def _required(obj: Mapping[str, object], key: str, where: str) -> str:
    """``obj[key]``: a string, not empty."""
    value = _string(obj, key, where)
    if not value:
        raise SpecError(f"{where}.{key} is required")
    return value


def _payload_path(obj: Mapping[str, object], where: str, key: str | None = None) -> str:
    """``obj["path"]``, required and a path the atomic writer accepts
    (``ValidateLocalNonReservedPath``: relative, no ``..`` element, not starting with ``..``,
    and the writer's own limits), cleaned as the writer cleans it; ``key`` is what the path
    holds, for the message."""
    path = _required(obj, "path", where)
    try:
        return validate_payload_path(path, key)
    except InvalidPayloadPathError as exc:
        raise SpecError(f"{where}.path: {exc}") from exc


def _key_paths(source: Mapping[str, object], name_key: str, where: str) -> list[str]:
    """A ConfigMap's or Secret's name and items (``validateConfigMapVolumeSource``,
    ``validateSecretVolumeSource``, and the projections of both); the item paths."""
    _required(source, name_key, where)
    return _items(source, where, keyed=True)


def _downward_api_files(source: Mapping[str, object], where: str) -> list[str]:
    """The items of a downwardAPI volume or projection (``validateDownwardAPIVolumeFile``:
    path and mode); their paths."""
    return _items(source, where, keyed=False)


def _items(source: Mapping[str, object], where: str, *, keyed: bool) -> list[str]:
    """Each of ``items``: its ``key`` when ``keyed`` (``validateKeyToPath``), its path and
    its mode; the paths."""
    paths = []
    for i, item in enumerate(_mappings(source, "items", where)):
        at = f"{where}.items[{i}]"
        key = _required(item, "key", at) if keyed else None
        paths.append(_payload_path(item, at, key))
        _mode(item, "mode", at)
    return paths


def _projected(projected: Mapping[str, object], where: str) -> None:
    """``validateProjectedVolumeSource`` and ``validateProjectionSources``: the default mode,
    one kind per source, each source's names, items and paths, and no path twice."""
    _mode(projected, "defaultMode", where)
    seen: set[str] = set()
    for i, source in enumerate(_mappings(projected, "sources", where)):
        at = f"{where}.sources[{i}]"
        kinds = {k: s for k in _PROJECTIONS if (s := _mapping(source, k, at)) is not None}
        if len(kinds) > 1:
            raise SpecError(f"{at} may not specify more than 1 volume type per source, "
                            f"got {', '.join(kinds)}")
        paths = [path for kind, found in kinds.items()
                 for path in _projection_paths(kind, found, f"{at}.{kind}")]
        for path in paths:
            if path in seen:
                raise SpecError(f"{at}: conflicting duplicate paths: {path!r} is given twice")
            seen.add(path)


def _projection_paths(kind: str, source: Mapping[str, object], where: str) -> list[str]:
    """The paths of one projected source of ``kind``, checked."""
    if kind in ("secret", "configMap"):
        return _key_paths(source, "name", where)
    if kind == "downwardAPI":
        return _downward_api_files(source, where)
    if kind == "serviceAccountToken":
        _token_lifetime(source, where)
    return [_payload_path(source, where)]


def _token_lifetime(token: Mapping[str, object], where: str) -> None:
    """A token's ``expirationSeconds``, when given, within 10 minutes..2^32 seconds."""
    seconds = _integer(token, "expirationSeconds", where)
    if seconds is not None and seconds < _MIN_TOKEN_SECONDS:
        raise SpecError(f"{where}.expirationSeconds {seconds}: may not specify a duration "
                        "less than 10 minutes")
    if seconds is not None and seconds > _MAX_TOKEN_SECONDS:
        raise SpecError(f"{where}.expirationSeconds {seconds}: may not specify a duration "
                        "larger than 2^32 seconds")


def validate_persistent_volume(pv: Mapping[str, object], where: str) -> None:
    """Raise SpecError unless PersistentVolume manifest ``pv`` has the shape kubevol reads."""
    meta = _metadata(pv, where)
    where = f"{where}: PersistentVolume {meta['name']}"
    spec = _mapping(pv, "spec", where) or {}
    _mapping(spec, "claimRef", f"{where} spec")
    capacity = _mapping(spec, "capacity", f"{where} spec") or {}
    _quantity(capacity.get("storage"), f"{where}: capacity.storage")
    mode = _string(spec, "volumeMode", f"{where} spec")
    if mode is not None and mode not in VOLUME_MODES:
        raise SpecError(f"{where}: volumeMode {mode!r} is not one of {VOLUME_MODES}")


def validate_claim(pvc: Mapping[str, object], where: str) -> None:
    """Raise SpecError unless PersistentVolumeClaim manifest ``pvc`` has the shape kubevol
    reads."""
    meta = _metadata(pvc, where)
    where = f"{where}: PersistentVolumeClaim {meta['name']}"
    spec = _mapping(pvc, "spec", where) or {}
    _string(spec, "volumeName", f"{where} spec")
