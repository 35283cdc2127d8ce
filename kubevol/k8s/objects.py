"""Where ConfigMaps and Secrets come from: the API objects a host exposes to plugins.

Two sources: :class:`ManifestObjects`, the ConfigMap and Secret documents given beside the
pods (``kubevol up`` without an API server), and :class:`KubeAPIObjects`, a real API server
read through the official ``kubernetes`` client with the API's semantics (404 → missing).
Either way plugins get :class:`ConfigMap` and :class:`Secret` values and a missing object
raises :class:`ObjectNotFoundError`, whose message is the API server's own
(``configmaps "app" not found``).

Values keep the API's wire form: ``data`` of a Secret and ``binaryData`` of a ConfigMap are
base64 text. Secret values are never part of a ``repr`` or an error message.
"""

from __future__ import annotations

import abc
import base64
import binascii
import copy
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kubevol.errors import KubevolError, SpecError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, V1ConfigMap, V1Secret


class ObjectNotFoundError(KubevolError, LookupError):
    """The object does not exist (the API answered 404, or no manifest defines it)."""

    def __init__(self, resource: str, namespace: str, name: str) -> None:
        super().__init__(f'{resource} "{name}" not found')
        self.resource = resource
        self.namespace = namespace
        self.name = name


class ObjectSourceError(KubevolError):
    """The object could not be read for another reason (API error, no source configured)."""


def _frozen_map(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class ConfigMap:
    """A ConfigMap's content: ``data`` as text, ``binary_data`` base64-encoded."""

    namespace: str
    name: str
    data: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)
    binary_data: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)

    def value(self, key: str) -> bytes | None:
        """The bytes of ``key`` (``data`` first, then ``binaryData``), or None."""
        if key in self.data:
            return self.data[key].encode("utf-8")
        if key in self.binary_data:
            return _b64(self.binary_data[key], "configmap", self.namespace, self.name, key)
        return None

    def items(self) -> dict[str, bytes]:
        """Every key with its bytes."""
        out = {k: v.encode("utf-8") for k, v in self.data.items()}
        for key, encoded in self.binary_data.items():
            out[key] = _b64(encoded, "configmap", self.namespace, self.name, key)
        return out


@attrs.frozen(kw_only=True)
class Secret:
    """A Secret's content; ``data`` values are base64 text as in the API (``.data``), and
    never shown."""

    namespace: str
    name: str
    data: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map, repr=False)
    type: str = "Opaque"

    def value(self, key: str) -> bytes | None:
        """The decoded bytes of ``key``, or None."""
        if key not in self.data:
            return None
        return _b64(self.data[key], "secret", self.namespace, self.name, key)

    def items(self) -> dict[str, bytes]:
        """Every key with its decoded bytes."""
        return {k: _b64(v, "secret", self.namespace, self.name, k) for k, v in self.data.items()}


def _b64(value: str, kind: str, namespace: str, name: str, key: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        # The value itself is not shown: for a Secret it is the secret.
        raise SpecError(f"{kind} {namespace}/{name} key {key!r} is not valid base64") from exc


class APIObjectSource(abc.ABC):
    """Reads ConfigMaps and Secrets for plugins. Implementations are thread-safe."""

    @abc.abstractmethod
    def get_config_map(self, namespace: str, name: str) -> ConfigMap:
        """The ConfigMap; raises :class:`ObjectNotFoundError` when there is none and
        :class:`ObjectSourceError` when it cannot be read."""

    @abc.abstractmethod
    def get_secret(self, namespace: str, name: str) -> Secret:
        """The Secret; raises as :meth:`get_config_map` does."""


def config_map_from_dict(obj: Mapping[str, Any], where: str = "<manifest>") -> ConfigMap:
    """A :class:`ConfigMap` from its API dict. Raises SpecError naming ``where`` when a
    field has the wrong shape."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not name:
        raise SpecError(f"a ConfigMap in {where} has no metadata.name")
    data = _string_map(obj.get("data"), f"ConfigMap {namespace}/{name} data", where)
    binary = _string_map(obj.get("binaryData"), f"ConfigMap {namespace}/{name} binaryData", where)
    for key in binary:
        if key in data:
            raise SpecError(f"{where}: ConfigMap {namespace}/{name} has key {key!r} in both "
                            "data and binaryData")
        _b64_in(where, binary[key], kind="configmap", namespace=namespace, name=str(name),
                key=key)
    return ConfigMap(namespace=namespace, name=str(name), data=data, binary_data=binary)


def secret_from_dict(obj: Mapping[str, Any], where: str = "<manifest>") -> Secret:
    """A :class:`Secret` from its API dict; ``stringData`` is merged into ``data`` as the API
    server does (it wins on a clash). Errors never show a value."""
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not name:
        raise SpecError(f"a Secret in {where} has no metadata.name")
    data = _string_map(obj.get("data"), f"Secret {namespace}/{name} data", where)
    for key, value in data.items():
        _b64_in(where, value, kind="secret", namespace=namespace, name=str(name), key=key)
    plain = _string_map(obj.get("stringData"), f"Secret {namespace}/{name} stringData", where)
    for key, value in plain.items():
        data[key] = base64.b64encode(value.encode("utf-8")).decode("ascii")
    return Secret(namespace=namespace, name=str(name), data=data,
                  type=str(obj.get("type") or "Opaque"))


def _b64_in(where: str, value: str, *, kind: str, namespace: str, name: str, key: str) -> None:
    try:
        _b64(value, kind, namespace, name, key)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from exc


def _string_map(value: object, what: str, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: {what} must be a mapping")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            # Name the key, never the value (it may be a secret).
            raise SpecError(f"{where}: {what} key {key!r} must map a string to a string")
        out[key] = item
    return out


class ManifestObjects(APIObjectSource):
    """ConfigMaps and Secrets given as API dicts (the documents of manifest files)."""

    def __init__(self, objects: Iterable[Mapping[str, object]] = (), where: str = "<manifest>"):
        self._config_maps: dict[tuple[str, str], ConfigMap] = {}
        self._secrets: dict[tuple[str, str], Secret] = {}
        self._lock = threading.Lock()
        for obj in objects:
            self.add(obj, where)

    def add(self, obj: Mapping[str, object], where: str = "<manifest>") -> None:
        """Add (or replace) a ConfigMap or Secret given as its API dict."""
        kind = obj.get("kind")
        with self._lock:
            if kind == "ConfigMap":
                cm = config_map_from_dict(obj, where)
                self._config_maps[(cm.namespace, cm.name)] = cm
            elif kind == "Secret":
                secret = secret_from_dict(obj, where)
                self._secrets[(secret.namespace, secret.name)] = secret
            else:
                raise SpecError(f"{where}: expected a ConfigMap or Secret, got kind {kind!r}")

    def get_config_map(self, namespace: str, name: str) -> ConfigMap:
        with self._lock:
            found = self._config_maps.get((namespace, name))
        if found is None:
            raise ObjectNotFoundError("configmap", namespace, name)
        return found

    def get_secret(self, namespace: str, name: str) -> Secret:
        with self._lock:
            found = self._secrets.get((namespace, name))
        if found is None:
            raise ObjectNotFoundError("secret", namespace, name)
        return found


class KubeAPIObjects(APIObjectSource):
    """Reads from an API server through a ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: ApiClient) -> None:
        self._client = api_client

    def _read(self, resource: str, namespace: str, name: str) -> V1ConfigMap | V1Secret:
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        read = getattr(CoreV1Api(self._client), f"read_namespaced_{resource}")
        try:
            return read(name, namespace)
        except ApiException as exc:
            plural = "configmaps" if resource == "config_map" else "secrets"
            if exc.status == 404:
                raise ObjectNotFoundError(plural[:-1], namespace, name) from None
            # The response body is not quoted: only the status says what went wrong.
            raise ObjectSourceError(
                f"cannot read {plural} {namespace}/{name}: API status {exc.status} {exc.reason}"
            ) from None
        except (HTTPError, OSError) as exc:
            raise ObjectSourceError(
                f"cannot reach the API server to read {namespace}/{name}: {exc}"
            ) from exc

    def get_config_map(self, namespace: str, name: str) -> ConfigMap:
        cm = self._read("config_map", namespace, name)
        return ConfigMap(namespace=namespace, name=name, data=copy.copy(cm.data) or {},
                         binary_data=copy.copy(cm.binary_data) or {})

    def get_secret(self, namespace: str, name: str) -> Secret:
        secret = self._read("secret", namespace, name)
        return Secret(namespace=namespace, name=name, data=copy.copy(secret.data) or {},
                      type=secret.type or "Opaque")


class ChainedObjects(APIObjectSource):
    """Asks each source in turn: the first that has the object answers. A source that
    fails for another reason than "not found" stops the search (its error is raised)."""

    def __init__(self, sources: Iterable[APIObjectSource]) -> None:
        self.sources = tuple(sources)

    def get_config_map(self, namespace: str, name: str) -> ConfigMap:
        for source in self.sources[:-1]:
            try:
                return source.get_config_map(namespace, name)
            except ObjectNotFoundError:
                continue
        return self.sources[-1].get_config_map(namespace, name)

    def get_secret(self, namespace: str, name: str) -> Secret:
        for source in self.sources[:-1]:
            try:
                return source.get_secret(namespace, name)
            except ObjectNotFoundError:
                continue
        return self.sources[-1].get_secret(namespace, name)


class NoObjects(APIObjectSource):
    """A host without an object source: every read fails, saying what to configure."""

    def __init__(self, hint: str = "give the ConfigMap/Secret manifests beside the pods, "
                 "or configure an API server (--kubeconfig)") -> None:
        self.hint = hint

    def get_config_map(self, namespace: str, name: str) -> ConfigMap:
        raise ObjectSourceError(f"cannot read configmap {namespace}/{name}: no source of API "
                                f"objects; {self.hint}")

    def get_secret(self, namespace: str, name: str) -> Secret:
        raise ObjectSourceError(f"cannot read secret {namespace}/{name}: no source of API "
                                f"objects; {self.hint}")
