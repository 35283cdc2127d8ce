"""``Spec``: the one internal description of a volume, whether a pod volume or a PersistentVolume.

The kubernetes client's model classes are imported only when a manifest is loaded or a
model is read, so ``import kubevol`` stays fast. API objects kubevol makes itself
(reconstruction: one per volume on disk) are kept as their dicts and built on first read
(:class:`DeferredApiObject`, :meth:`Spec.from_api_data`): importing the model classes and
building one per volume cost more than the rest of a scan, which usually needs neither.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from inspect import signature
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs

from kubevol.errors import SpecError, UntrustedDataError
from kubevol.k8s.pod import Pod
from kubevol.layout import validate_path_segment
from kubevol.util import safeyaml, units
from kubevol.util.units import UnitError

if TYPE_CHECKING:
    # Model classes only in annotations: importing kubernetes is slow (see the docstring).
    from kubernetes.client import ApiClient, V1PersistentVolume, V1Volume

#: An API object as its JSON mapping (a manifest's document, a model's dict).
ApiMapping = Mapping[str, Any]

_T = TypeVar("_T")


def _exactly_one_source(instance: Spec, _attribute: object, _value: object) -> None:
    volume, pv = instance._volume is not None, instance._persistent_volume is not None
    if volume == pv:
        raise SpecError(
            "a Spec needs exactly one of volume or persistent_volume, "
            f"got volume={volume} and persistent_volume={pv}"
        )


class DeferredApiObject:
    """The kubernetes client's model ``type_name`` of ``data`` (a dict with the API's field
    names), built by :func:`api_object` on the first attribute read and delegated to from
    then on.

    kubevol makes these where it knows the dict and rarely needs more (the pod a
    reconstructed volume belongs to: its UID, which :func:`pod_uid` reads from ``data``).
    A caller that needs the model itself (``isinstance``, embedding it in another model)
    calls :meth:`model`. ``data`` must be a valid ``type_name``: a build that fails raises
    :class:`SpecError` where the attribute was read.
    """

    __slots__ = ("_model", "data", "type_name")

    def __init__(self, type_name: str, data: ApiMapping) -> None:
        self.type_name = type_name
        self.data = data
        self._model: object = None

    def model(self) -> Any:
        """The model, built once."""
        if self._model is None:
            self._model = api_object(self.type_name, self.data)
        return self._model

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy/pickle probing: not a model field
            raise AttributeError(name)
        return getattr(self.model(), name)

    def __repr__(self) -> str:
        return f"DeferredApiObject({self.type_name!r}, {self.data!r})"


@attrs.frozen
class KnownSource:
    """A volume source read the way plugins read the model's (``source.medium``): its
    ``fields`` (the model's attribute names), every other name unset (None).

    A plugin that makes a Spec from API data (:meth:`Spec.from_api_data`) seeds
    :meth:`Spec.derived` with one, so that reading the source of a reconstructed volume
    builds no model; its tests hold it equal, field by field, to the source of the model
    built from the same data."""

    fields: ApiMapping = attrs.field(factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.fields.get(name)


def _model(value: _T | DeferredApiObject) -> _T:
    return value.model() if isinstance(value, DeferredApiObject) else value


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

    # The API objects, or DeferredApiObjects of them (from_api_data): read through the
    # properties below, which build a deferred one on first read.
    _volume: V1Volume | DeferredApiObject | None = attrs.field(
        default=None, alias="volume", validator=_exactly_one_source
    )
    _persistent_volume: V1PersistentVolume | DeferredApiObject | None = attrs.field(
        default=None, alias="persistent_volume"
    )
    read_only: bool = False
    inline_volume_spec_for_csi_migration: bool = False
    migrated: bool = False
    _derived: dict[str, object] = attrs.field(factory=dict, init=False, repr=False)

    @property
    def volume(self) -> Any:
        """The pod's ``V1Volume``, or None."""
        return _model(self._volume)

    @property
    def persistent_volume(self) -> Any:
        """The ``V1PersistentVolume``, or None."""
        return _model(self._persistent_volume)

    @property
    def is_persistent_volume(self) -> bool:
        """Whether this is a PersistentVolume's Spec (read without building a model)."""
        return self._persistent_volume is not None

    def derived(self, key: str, read: Callable[[Spec], _T]) -> _T:
        """``read(self)``, computed once per Spec and ``key`` (a plugin names its key, e.g.
        ``"kubernetes.io/csi:source"``). Raises what ``read`` raises; a failure is not
        remembered."""
        try:
            # What read (or from_api_data's ``known``, which must match it) stored there.
            return cast(_T, self._derived[key])
        except KeyError:
            value = self._derived[key] = read(self)
        return value

    @classmethod
    def from_volume(cls, volume: V1Volume) -> Spec:
        """A Spec for a pod volume (``kubernetes.client.V1Volume``)."""
        return cls(volume=volume)

    @classmethod
    def from_persistent_volume(cls, pv: V1PersistentVolume, read_only: bool = False) -> Spec:
        """A Spec for a PersistentVolume (``kubernetes.client.V1PersistentVolume``)."""
        return cls(persistent_volume=pv, read_only=read_only)

    @classmethod
    def from_api_data(
        cls,
        *,
        volume: ApiMapping | None = None,
        persistent_volume: ApiMapping | None = None,
        read_only: bool = False,
        known: ApiMapping | None = None,
    ) -> Spec:
        """A Spec of a pod volume or a PersistentVolume kubevol makes itself, given as the
        API's dict (``{"name": ..., "emptyDir": {}}``): its model is built only when
        :attr:`volume` or :attr:`persistent_volume` is read (:class:`DeferredApiObject`).
        ``known`` seeds :meth:`derived` with what the plugin that makes the Spec knows
        already; each value must be what that key's reader returns for the built model
        (the plugins' tests hold them equal), so that a scan never builds one."""
        spec = cls(
            volume=None if volume is None else DeferredApiObject("V1Volume", volume),
            persistent_volume=(
                None if persistent_volume is None
                else DeferredApiObject("V1PersistentVolume", persistent_volume)
            ),
            read_only=read_only,
        )
        spec._derived.update(known or {})
        return spec

    @classmethod
    def from_manifest(
        cls, manifest: ApiMapping | str, read_only: bool = False, *, accepted: bool = False
    ) -> Spec:
        """A Spec from a dict or YAML text of a PersistentVolume object or of a pod volume.

        A mapping with ``kind: PersistentVolume`` is a PersistentVolume; a mapping with a
        ``name`` and no ``kind`` is a pod volume. Deserialisation is the kubernetes client's
        own, so field names are the API's (``hostPath``, ``emptyDir``, ...). ``accepted``:
        the dict was accepted before and read back as JSON (a pod's record), so its model is
        validated in one call (:func:`api_object`, 4-7 times faster): a YAML manifest's
        values that JSON has not (a date) would reach the model as they are.
        """
        data = _load_mapping(manifest)
        kind = data.get("kind")
        if kind == "PersistentVolume":
            pv = (api_object("V1PersistentVolume", data) if accepted
                  else deserialize(data, "V1PersistentVolume"))
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
        volume = api_object("V1Volume", data) if accepted else deserialize(data, "V1Volume")
        return cls(volume=volume, read_only=read_only)

    def name(self) -> str:
        """The pod volume's name, else the PersistentVolume's name, else ``""``."""
        volume, pv = self._volume, self._persistent_volume
        if isinstance(volume, DeferredApiObject):
            return str(volume.data.get("name") or "")
        if volume is not None:
            return str(volume.name or "")
        if isinstance(pv, DeferredApiObject):
            return str((pv.data.get("metadata") or {}).get("name") or "")
        metadata = getattr(pv, "metadata", None)  # pv is set: exactly one of them is
        return str(metadata.name or "") if metadata is not None else ""


def _load_mapping(manifest: ApiMapping | str) -> ApiMapping:
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

    def __init__(self, data: ApiMapping) -> None:
        self.data = json.dumps(data)


def deserialize(data: ApiMapping, type_name: str) -> Any:
    """Turn an API object's dict into the kubernetes client's model class ``type_name``.

    Uses the client's own deserialisation so the result is exactly what the client
    returns from an API server.
    """
    api, takes_text = _deserializer()
    try:
        if takes_text:
            return api.deserialize(json.dumps(data), type_name, "application/json")
        return api.deserialize(_JSONResponse(data), type_name)
    except (ValueError, TypeError) as exc:
        raise SpecError(f"not a valid {type_name[2:]} manifest: {exc}") from exc


@functools.cache
def _deserializer() -> tuple[ApiClient, bool]:
    """One client for the process (deserialising needs no connection; a client per call
    cost a configuration each), and whether its ``deserialize`` takes the response text and
    its content type (newer clients) or a response object with ``data`` (older ones)."""
    from kubernetes.client import ApiClient  # imported lazily: a slow import

    api = ApiClient()
    return api, "content_type" in signature(api.deserialize).parameters


def api_object(type_name: str, data: ApiMapping) -> Any:
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


def pod_uid(pod: Pod) -> str:
    """The validated UID of a ``V1Pod`` (or a :class:`DeferredApiObject` of one, read
    without building it); raises SpecError when it has none."""
    if isinstance(pod, DeferredApiObject):
        uid = (pod.data.get("metadata") or {}).get("uid")
    else:
        uid = getattr(getattr(pod, "metadata", None), "uid", None)
    if not uid:
        raise SpecError("the pod has no metadata.uid; kubevol needs it to lay out its volumes")
    return validate_path_segment(str(uid), "pod UID")


def quantity_bytes(quantity: object) -> int | None:
    """A Kubernetes quantity (``"64Mi"``, ``1G``) as whole bytes, rounded up (see
    :func:`kubevol.util.units.quantity_bytes`); None and "" stay None."""
    if quantity is None or quantity == "":
        return None
    try:
        return units.quantity_bytes(quantity)
    except UnitError as exc:
        raise SpecError(f"{quantity!r} is not a valid quantity: {exc}") from exc
