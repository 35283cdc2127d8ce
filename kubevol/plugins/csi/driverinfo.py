"""What the node needs to know about a CSI driver beyond its socket: its ``CSIDriver`` object.

The CSI plugin reads ``attachRequired``, ``podInfoOnMount``, ``fsGroupPolicy``,
``requiresRepublish``, ``seLinuxMount`` and ``volumeLifecycleModes`` through ONE hook: a
lookup ``name -> V1CSIDriver | None`` (the host's ``get_csi_driver``, or one given to the
plugin). The sources here are such lookups:

- :class:`KubernetesCSIDrivers` reads CSIDriver objects from an API server with the
  ``kubernetes`` client;
- :class:`LocalCSIDrivers` reads them from YAML when there is no API server, applying the
  defaults the API server would have applied.

``None`` means "no CSIDriver object": the kubelet then attaches, adds no pod information,
uses the ``ReadWriteOnceWithFSType`` fsGroup policy and refuses ephemeral volumes.
"""

from __future__ import annotations

import copy
import enum
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kubevol.errors import KubevolError, UntrustedDataError
from kubevol.spec import ApiMapping
from kubevol.util import safeyaml

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, V1CSIDriver

#: ``name -> V1CSIDriver | None``: the one shape every CSIDriver source has.
CSIDriverLookup = Callable[[str], "V1CSIDriver | None"]

LIFECYCLE_PERSISTENT = "Persistent"
LIFECYCLE_EPHEMERAL = "Ephemeral"


class FSGroupPolicy(enum.StrEnum):
    """A CSIDriver's ``fsGroupPolicy``."""

    NONE = "None"
    FILE = "File"
    READ_WRITE_ONCE_WITH_FS_TYPE = "ReadWriteOnceWithFSType"


class CSIDriverInfoError(KubevolError, ValueError):
    """A CSIDriver object or source could not be read; the message names it."""


@attrs.frozen(kw_only=True)
class DriverTokenRequest:
    """One of a CSIDriver's ``spec.tokenRequests``: a token of the pod's service account
    for ``audience`` ("" for the API server's own), valid ``expiration_seconds`` (None: the
    TokenRequest API's default)."""

    audience: str = ""
    expiration_seconds: int | None = None


def _token_requests(name: str, raw: object) -> tuple[DriverTokenRequest, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(r, Mapping) for r in raw):
        raise CSIDriverInfoError(f"CSIDriver {name!r}: tokenRequests must be a list of mappings")
    out = []
    for r in raw:
        seconds = r.get("expirationSeconds")
        if seconds is not None and (not isinstance(seconds, int) or seconds < 600):
            raise CSIDriverInfoError(
                f"CSIDriver {name!r}: tokenRequests expirationSeconds {seconds!r} must be an "
                "integer of at least 600 (10 minutes)")
        out.append(DriverTokenRequest(audience=str(r.get("audience") or ""),
                                      expiration_seconds=seconds))
    return tuple(out)


@attrs.frozen(kw_only=True)
class CSIDriverInfo:
    """The fields of a ``CSIDriver`` object the node uses.

    ``fs_group_policy`` is None when the object carries none (the kubelet then refuses to
    mount: an API server always defaults it).
    """

    name: str
    attach_required: bool = True
    pod_info_on_mount: bool = False
    fs_group_policy: FSGroupPolicy | None = FSGroupPolicy.READ_WRITE_ONCE_WITH_FS_TYPE
    requires_republish: bool = False
    selinux_mount: bool = False
    volume_lifecycle_modes: tuple[str, ...] = (LIFECYCLE_PERSISTENT,)
    #: ``spec.tokenRequests``: the service-account tokens the driver receives at publish.
    token_requests: tuple[DriverTokenRequest, ...] = ()

    @classmethod
    def from_object(cls, obj: V1CSIDriver | ApiMapping) -> CSIDriverInfo:
        """Read a ``V1CSIDriver`` (or its dict form) as an API server returned it.

        Unset booleans read as the API's defaults; an unset ``fsGroupPolicy`` stays None.
        Raises :class:`CSIDriverInfoError` for an object without a name or an unknown policy.
        """
        data = _as_dict(obj)
        name = (data.get("metadata") or {}).get("name")
        if not name:
            raise CSIDriverInfoError("the CSIDriver object has no metadata.name")
        spec = data.get("spec") or {}
        policy = spec.get("fsGroupPolicy")
        try:
            fs_group_policy = FSGroupPolicy(policy) if policy else None
        except ValueError:
            raise CSIDriverInfoError(
                f"CSIDriver {name!r} has fsGroupPolicy {policy!r}; expected one of "
                f"{[p.value for p in FSGroupPolicy]}"
            ) from None
        modes = spec.get("volumeLifecycleModes")
        unknown = sorted(set(modes or ()) - {LIFECYCLE_PERSISTENT, LIFECYCLE_EPHEMERAL})
        if unknown:
            raise CSIDriverInfoError(
                f"CSIDriver {name!r} has volumeLifecycleModes {unknown}; expected "
                f"{LIFECYCLE_PERSISTENT!r} or {LIFECYCLE_EPHEMERAL!r}"
            )
        return cls(
            token_requests=_token_requests(name, spec.get("tokenRequests")),
            name=name,
            attach_required=_flag(spec.get("attachRequired"), True),
            pod_info_on_mount=_flag(spec.get("podInfoOnMount"), False),
            fs_group_policy=fs_group_policy,
            requires_republish=_flag(spec.get("requiresRepublish"), False),
            selinux_mount=_flag(spec.get("seLinuxMount"), False),
            volume_lifecycle_modes=tuple(modes) if modes else (LIFECYCLE_PERSISTENT,),
        )

    def supports_lifecycle_mode(self, mode: str) -> bool:
        """Whether ``mode`` (``Persistent`` or ``Ephemeral``) is listed."""
        return mode in self.volume_lifecycle_modes


def _flag(value: object, default: bool) -> bool:
    return default if value is None else bool(value)


def _as_dict(obj: V1CSIDriver | ApiMapping) -> ApiMapping:
    """A CSIDriver as the API's camelCase dict, whether a model object or a dict."""
    if isinstance(obj, Mapping):
        return dict(obj)
    from kubernetes.client import ApiClient

    data = ApiClient().sanitize_for_serialization(obj)
    if not isinstance(data, dict):
        raise CSIDriverInfoError(f"not a CSIDriver object: {type(obj).__name__}")
    return data


def lookup_driver_info(lookup: CSIDriverLookup, name: str) -> CSIDriverInfo | None:
    """The information of driver ``name`` from ``lookup``, None when it has no object."""
    obj = lookup(name)
    return None if obj is None else CSIDriverInfo.from_object(obj)


# --- sources ------------------------------------------------------------------------


def check_csidriver(obj: Mapping[str, object]) -> dict[str, Any]:
    """A CSIDriver object (dict form) with the API server's defaults, checked as the
    kubelet will read it (its policy and lifecycle modes), so that a typo fails when the
    object is loaded rather than at mount time. Raises :class:`CSIDriverInfoError`."""
    kind = obj.get("kind", "CSIDriver")
    if kind != "CSIDriver":
        raise CSIDriverInfoError(f"expected a CSIDriver object, got kind {kind!r}")
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name"):
        raise CSIDriverInfoError("a CSIDriver object needs metadata.name")
    if not isinstance(obj.get("spec") or {}, Mapping):
        raise CSIDriverInfoError("a CSIDriver's spec must be a mapping")
    data = _default_csidriver(dict(obj))
    CSIDriverInfo.from_object(data)
    return data


def _default_csidriver(data: ApiMapping) -> dict[str, Any]:
    """Apply the API server's defaults to a CSIDriver dict (what storage/v1 defaulting does)."""
    out = dict(data)
    spec = dict(out.get("spec") or {})
    spec.setdefault("attachRequired", True)
    spec.setdefault("podInfoOnMount", False)
    spec.setdefault("fsGroupPolicy", FSGroupPolicy.READ_WRITE_ONCE_WITH_FS_TYPE.value)
    spec.setdefault("requiresRepublish", False)
    spec.setdefault("storageCapacity", False)
    spec.setdefault("seLinuxMount", False)
    if not spec.get("volumeLifecycleModes"):
        spec["volumeLifecycleModes"] = [LIFECYCLE_PERSISTENT]
    out["spec"] = spec
    out.setdefault("apiVersion", "storage.k8s.io/v1")
    out.setdefault("kind", "CSIDriver")
    return out


class LocalCSIDrivers:
    """CSIDriver objects from local configuration, for nodes without an API server.

    Give the objects as dicts, or load YAML (one or more documents, or ``items`` of a
    ``List``) with :meth:`from_yaml` / :meth:`from_file`. Documents of another kind are
    refused. The API server's defaults are applied, so an object that only names the
    driver behaves as it would in a cluster. Lookups return ``V1CSIDriver`` objects.
    """

    def __init__(self, objects: Iterable[ApiMapping] = ()) -> None:
        self._objects: dict[str, V1CSIDriver] = {}
        #: The dict each model was built from: the same object given again (a node learns
        #: its manifests' objects at every change) is neither checked nor built again.
        self._given: dict[str, object] = {}
        self._lock = threading.Lock()
        for obj in objects:
            self.add(obj)

    @classmethod
    def from_yaml(cls, text: str) -> LocalCSIDrivers:
        """Objects from YAML text; raises :class:`CSIDriverInfoError` naming what is wrong."""
        try:
            docs = [d for d in safeyaml.load_all(text, "the CSIDriver YAML") if d is not None]
        except UntrustedDataError as exc:
            raise CSIDriverInfoError(str(exc)) from exc
        objects: list[ApiMapping] = []
        for doc in docs:
            if not isinstance(doc, Mapping):
                raise CSIDriverInfoError(
                    f"a CSIDriver document must be a mapping, got {type(doc).__name__}"
                )
            items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else None
            objects.extend(items if isinstance(items, list) else [doc])
        return cls(objects)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> LocalCSIDrivers:
        """Objects from a YAML file."""
        try:
            text = safeyaml.read_manifest(os.fspath(path))
        except (OSError, UntrustedDataError) as exc:
            raise CSIDriverInfoError(
                f"cannot read CSIDriver file {os.fspath(path)!r}: {exc}"
            ) from exc
        return cls.from_yaml(text)

    def add(self, obj: ApiMapping) -> None:
        """Add or replace one CSIDriver object (dict form)."""
        name = (obj.get("metadata") or {}).get("name")
        with self._lock:
            if name in self._given and self._given[name] == obj:
                return
        data = check_csidriver(obj)
        from kubevol.spec import deserialize

        model = deserialize(data, "V1CSIDriver")
        with self._lock:
            self._objects[data["metadata"]["name"]] = model
            self._given[data["metadata"]["name"]] = copy.deepcopy(dict(obj))

    def names(self) -> list[str]:
        """The drivers described, sorted."""
        with self._lock:
            return sorted(self._objects)

    def __call__(self, name: str) -> V1CSIDriver | None:
        """The ``V1CSIDriver`` named ``name``, or None."""
        with self._lock:
            return self._objects.get(name)


class KubernetesCSIDrivers:
    """CSIDriver objects read from an API server through the ``kubernetes`` client.

    ``api_client`` is a ``kubernetes.client.ApiClient``. Each lookup is one GET; a 404 is
    "no object" (None); any other failure raises :class:`CSIDriverInfoError`, which the
    plugin turns into a transient error where the kubelet does.
    """

    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client

    def __call__(self, name: str) -> V1CSIDriver | None:
        from kubernetes.client import StorageV1Api
        from kubernetes.client.exceptions import ApiException

        try:
            return StorageV1Api(self.api_client).read_csi_driver(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise CSIDriverInfoError(
                f"cannot read CSIDriver {name!r} from the API server: {exc.status} {exc.reason}"
            ) from exc
        except Exception as exc:  # transport failures (connection refused, ...)
            raise CSIDriverInfoError(
                f"cannot read CSIDriver {name!r} from the API server: {exc}"
            ) from exc
