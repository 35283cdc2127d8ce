"""``Spec``: the one internal description of a volume, whether a pod volume or a PersistentVolume.

The kubernetes client's model classes are imported only when a manifest is loaded, so
``import kubevol`` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from inspect import signature
from typing import Any, TypeVar

import attrs

from kubevol import safeyaml, units
from kubevol.errors import SpecError, UntrustedDataError
from kubevol.layout import validate_path_segment
from kubevol.units import UnitError

_T = TypeVar("_T")


def _exactly_one_source(instance: Spec, _attribute: object, _value: object) -> None:
    if (instance.volume is None) == (instance.persistent_volume is None):
        raise SpecError(
            "a Spec needs exactly one of volume or persistent_volume, "
            f"got volume={instance.volume is not None} "
            f"and persistent_volume={instance.persistent_volume is not None}"
        )


@attrs.frozen(kw_only=True, eq=False)
class Spec:
    """A volume as plugins see it: a pod's ``V1Volume`` or a ``V1PersistentVolume``.

    Specs compare and hash by identity, as Kubernetes keys maps by ``*Spec``: the API
    model classes inside are mutable and unhashable.

    Exactly one of ``volume`` and ``persistent_volume`` is set, else :class:`SpecError`
    (a ``ValueError``) is raised.

    Like the kubelet, kubevol treats the API objects inside a Spec as immutable: what a
    plugin reads out of them may be kept with the Spec (:meth:`derived`), for as long as the
    Spec lives and no longer.
    """

    volume: Any = attrs.field(default=None, validator=_exactly_one_source)
    persistent_volume: Any = None
    read_only: bool = False
    inline_volume_spec_for_csi_migration: bool = False
    migrated: bool = False
    _derived: dict[str, Any] = attrs.field(factory=dict, init=False, repr=False)

    def derived(self, key: str, read: Callable[[Spec], _T]) -> _T:
        """``read(self)``, computed once per Spec and ``key`` (a plugin names its key, e.g.
        ``"kubernetes.io/csi:source"``). Raises what ``read`` raises; a failure is not
        remembered."""
        try:
            value: _T = self._derived[key]
        except KeyError:
            value = self._derived[key] = read(self)
        return value

    @classmethod
    def from_volume(cls, volume: Any) -> Spec:
        """A Spec for a pod volume (``kubernetes.client.V1Volume``)."""
        return cls(volume=volume)

    @classmethod
    def from_persistent_volume(cls, pv: Any, read_only: bool = False) -> Spec:
        """A Spec for a PersistentVolume (``kubernetes.client.V1PersistentVolume``)."""
        return cls(persistent_volume=pv, read_only=read_only)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any] | str, read_only: bool = False) -> Spec:
        """A Spec from a dict or YAML text of a PersistentVolume object or of a pod volume.

        A mapping with ``kind: PersistentVolume`` is a PersistentVolume; a mapping with a
        ``name`` and no ``kind`` is a pod volume. Deserialisation is the kubernetes client's
        own, so field names are the API's (``hostPath``, ``emptyDir``, ...).
        """
        data = _load_mapping(manifest)
        kind = data.get("kind")
        if kind == "PersistentVolume":
            pv = deserialize(data, "V1PersistentVolume")
            if pv.metadata is None or not pv.metadata.name:
                raise SpecError("the PersistentVolume manifest has no metadata.name")
            return cls.from_persistent_volume(pv, read_only=read_only)
        if kind is not None:
            raise SpecError(
                f"cannot make a volume Spec from a {kind!r} manifest: "
                "expected a PersistentVolume or a pod volume (a mapping with 'name')"
            )
        if not data.get("name"):
            raise SpecError("a pod volume manifest needs a non-empty 'name'")
        return cls(volume=deserialize(data, "V1Volume"), read_only=read_only)

    def name(self) -> str:
        """The pod volume's name, else the PersistentVolume's name, else ``""``."""
        if self.volume is not None:
            return str(self.volume.name or "")
        metadata = self.persistent_volume.metadata
        return str(metadata.name or "") if metadata is not None else ""


def _load_mapping(manifest: Mapping[str, Any] | str) -> dict[str, Any]:
    if isinstance(manifest, str):
        try:
            loaded = safeyaml.load(manifest, "the manifest")
        except UntrustedDataError as exc:
            raise SpecError(str(exc)) from exc
    else:
        loaded = manifest
    if not isinstance(loaded, Mapping):
        raise SpecError(f"a manifest must be a mapping, got {type(loaded).__name__}")
    return dict(loaded)


class _JSONResponse:
    """The shape ``ApiClient.deserialize`` reads: an object with a ``data`` string."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = json.dumps(data)


def deserialize(data: Mapping[str, Any], type_name: str) -> Any:
    """Turn an API object's dict into the kubernetes client's model class ``type_name``.

    Uses the client's own deserialisation so the result is exactly what the client
    returns from an API server.
    """
    from kubernetes.client import ApiClient  # imported lazily: ~0.3 s

    api = ApiClient()
    try:
        # Newer clients take the response text and its content type; older ones take a
        # response object with a ``data`` attribute.
        if "content_type" in signature(api.deserialize).parameters:
            return api.deserialize(json.dumps(data), type_name, "application/json")
        return api.deserialize(_JSONResponse(data), type_name)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"not a valid {type_name[2:]} manifest: {exc}") from exc


def api_object(type_name: str, data: Mapping[str, Any]) -> Any:
    """The kubernetes client's model ``type_name`` built from a dict with the API's field
    names (``volumeHandle``), for objects kubevol makes itself (reconstructed volumes).

    Clients whose models are pydantic validate the whole dict in one call, about twice as
    fast as building each nested model (this runs once per volume when a node is
    reconstructed); older clients go through :func:`deserialize`. Raises
    :class:`SpecError` when ``data`` is not a valid ``type_name``.
    """
    from kubernetes import client

    validate = getattr(getattr(client, type_name), "model_validate", None)
    if validate is None:
        return deserialize(data, type_name)
    try:
        return validate(data)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise SpecError(f"not a valid {type_name[2:]}: {exc}") from exc


def pod_uid(pod: Any) -> str:
    """The validated UID of a ``V1Pod``; raises SpecError when it has none."""
    uid = getattr(getattr(pod, "metadata", None), "uid", None)
    if not uid:
        raise SpecError("the pod has no metadata.uid; kubevol needs it to lay out its volumes")
    return validate_path_segment(str(uid), "pod UID")


def quantity_bytes(quantity: Any) -> int | None:
    """A Kubernetes quantity (``"64Mi"``, ``1G``) as whole bytes, rounded up (see
    :func:`kubevol.units.quantity_bytes`); None and "" stay None."""
    if quantity is None or quantity == "":
        return None
    try:
        return units.quantity_bytes(quantity)
    except UnitError as exc:
        raise SpecError(f"{quantity!r} is not a valid quantity: {exc}") from exc
