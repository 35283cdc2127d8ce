"""A stand-in Kubernetes API server on loopback, for testing code that talks to the API with
the official ``kubernetes`` client: the real paths, verbs, object shapes and error
``Status`` objects for the resources kubevol's CSI code uses.

Served: CSIDrivers and VolumeAttachments (``storage.k8s.io/v1``: list, get, create, delete,
status get/put/patch), Secrets and ConfigMaps (``v1``, namespaced: list, get, create) and
the TokenRequest subresource of ServiceAccounts (``POST …/serviceaccounts/<sa>/token``: a
token bound to the pod named in the request, for an existing ServiceAccount). It is NOT an
API server: no watch, no selectors, no admission; objects are kept in memory.

The test plays the external attacher: :meth:`KubeAPIServer.set_attached`,
:meth:`~KubeAPIServer.set_attach_error`, :meth:`~KubeAPIServer.set_detach_error` and
:meth:`~KubeAPIServer.finish_detach` drive VolumeAttachment status, or ``auto_attach``
does it on creation. With ``hold_detach`` a delete only sets ``deletionTimestamp`` (as a
finalizer would) until the test finishes the detach.

::

    with KubeAPIServer(auto_attach=True) as api:
        client = api.api_client()          # kubernetes.client.ApiClient
        StorageV1Api(client).read_csi_driver("x")   # -> 404 ApiException
"""

from __future__ import annotations

import base64
import copy
import datetime
import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubevol.lifecycle import RunsWhileEntered

_STORAGE = "/apis/storage.k8s.io/v1"
_ROUTES = [
    (re.compile(rf"^{_STORAGE}/(csidrivers|volumeattachments)$"), "collection"),
    (re.compile(rf"^{_STORAGE}/(csidrivers|volumeattachments)/([^/]+)$"), "object"),
    (re.compile(rf"^{_STORAGE}/(volumeattachments)/([^/]+)/status$"), "status"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/(secrets|configmaps)$"), "ns-collection"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/(secrets|configmaps)/([^/]+)$"), "ns-object"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/serviceaccounts/([^/]+)/token$"), "token"),
]
_KINDS = {
    "csidrivers": ("storage.k8s.io/v1", "CSIDriver", "storage.k8s.io"),
    "volumeattachments": ("storage.k8s.io/v1", "VolumeAttachment", "storage.k8s.io"),
    "secrets": ("v1", "Secret", ""),
    "configmaps": ("v1", "ConfigMap", ""),
    "serviceaccounts": ("v1", "ServiceAccount", ""),
}
#: What the API defaults a TokenRequest's expirationSeconds to.
_DEFAULT_TOKEN_SECONDS = 3600


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class APIStatusError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.details = dict(details)

    def body(self) -> dict[str, Any]:
        """The ``Status`` object."""
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(self),
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _not_found(resource: str, name: str) -> APIStatusError:
    group = _KINDS[resource][2]
    qualified = f"{resource}.{group}" if group else resource
    return APIStatusError(404, "NotFound", f'{qualified} "{name}" not found',
                          {"name": name, "group": group, "kind": resource})


def _already_exists(resource: str, name: str) -> APIStatusError:
    group = _KINDS[resource][2]
    qualified = f"{resource}.{group}" if group else resource
    return APIStatusError(409, "AlreadyExists", f'{qualified} "{name}" already exists',
                          {"name": name, "group": group, "kind": resource})


def default_csidriver(obj: dict[str, Any]) -> dict[str, Any]:
    """What storage/v1 defaulting does to a CSIDriver on create."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("attachRequired", True)
    spec.setdefault("podInfoOnMount", False)
    spec.setdefault("fsGroupPolicy", "ReadWriteOnceWithFSType")
    spec.setdefault("requiresRepublish", False)
    spec.setdefault("storageCapacity", False)
    spec.setdefault("seLinuxMount", False)
    if not spec.get("volumeLifecycleModes"):
        spec["volumeLifecycleModes"] = ["Persistent"]
    return obj


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """JSON merge patch (RFC 7386): None deletes, dicts merge, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class KubeAPIServer(RunsWhileEntered):
    """The stand-in server; see the module docstring. Thread-safe.

    ``auto_attach``: mark a new VolumeAttachment attached at once with
    ``attach_metadata`` as ``status.attachmentMetadata``. ``hold_detach``: a delete sets
    ``deletionTimestamp`` and keeps the object until :meth:`finish_detach`.
    """

    def __init__(
        self,
        *,
        auto_attach: bool = False,
        attach_metadata: Mapping[str, str] | None = None,
        hold_detach: bool = False,
    ) -> None:
        self.auto_attach = auto_attach
        self.attach_metadata = dict(attach_metadata or {})
        self.hold_detach = hold_detach
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._version = 0
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []
        self._failures: list[tuple[str, str, int]] = []
        self.on_create: Callable[[str, dict[str, Any]], None] | None = None
        #: TokenRequests answered, as (namespace, service account, request body).
        self.token_requests: list[tuple[str, str, dict[str, Any]]] = []
        #: Makes the token for a request: (namespace, service account, spec) → token.
        self.token_factory: Callable[[str, str, Mapping[str, Any]], str] = (
            lambda ns, sa, spec: f"token-{ns}-{sa}-{uuid.uuid4().hex}"
        )
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- serving ----------------------------------------------------------------------

    def start(self) -> KubeAPIServer:
        """Listen on 127.0.0.1 (a free port) in a background thread."""
        if self._httpd is not None:
            return self
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: tests read :attr:`KubeAPIServer.requests` instead."""

            def _serve(self) -> None:
                server._dispatch(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="kube-api",
            daemon=True,
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self._httpd is None:
            raise RuntimeError("the stand-in API server is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` pointed at this server."""
        from kubernetes.client import ApiClient, Configuration

        config = Configuration()
        config.host = self.url
        return ApiClient(config)

    def stop(self) -> None:
        """Stop serving. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # --- test controls ----------------------------------------------------------------

    def fail_next(self, method: str, path: str, code: int = 500) -> None:
        """Answer the next ``method`` request to exactly ``path`` with ``code``."""
        with self._lock:
            self._failures.append((method.upper(), path, code))

    def add_csidriver(self, obj: Mapping[str, Any], *, defaults: bool = True) -> dict[str, Any]:
        """Store a CSIDriver (dict form), defaulted like the API server unless told not to."""
        data = copy.deepcopy(dict(obj))
        if defaults:
            default_csidriver(data)
        return self._store("csidrivers", "", data)

    def add_secret(self, namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
        """Store a Secret whose ``data`` are the given plain strings (base64-encoded here)."""
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        return self._store("secrets", namespace,
                           {"metadata": {"name": name, "namespace": namespace}, "data": encoded})

    def add_config_map(
        self, namespace: str, name: str, data: Mapping[str, str],
        binary_data: Mapping[str, bytes] | None = None,
    ) -> dict[str, Any]:
        """Store a ConfigMap (``binary_data`` given as bytes, base64-encoded here)."""
        obj: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace},
                               "data": dict(data)}
        if binary_data:
            obj["binaryData"] = {k: base64.b64encode(v).decode() for k, v in binary_data.items()}
        return self._store("configmaps", namespace, obj)

    def add_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        """Store a ServiceAccount (TokenRequests for it are then answered)."""
        return self._store("serviceaccounts", namespace,
                           {"metadata": {"name": name, "namespace": namespace}})

    def delete(self, resource: str, name: str, namespace: str = "") -> None:
        """Remove a stored object (as if deleted in the cluster)."""
        with self._lock:
            self._objects.pop((resource, namespace, name), None)

    def get(self, resource: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """A copy of a stored object, or None."""
        with self._lock:
            found = self._objects.get((resource, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def names(self, resource: str) -> list[str]:
        """Names of the stored objects of ``resource``."""
        with self._lock:
            return sorted(n for (r, _, n) in self._objects if r == resource)

    def set_attached(self, name: str, attached: bool = True,
                     metadata: Mapping[str, str] | None = None) -> None:
        """Play the external attacher: set ``status.attached`` (and the metadata)."""
        self._update_status(name, {"attached": attached,
                                   "attachmentMetadata": dict(metadata or {}) or None,
                                   "attachError": None})

    def set_attach_error(self, name: str, message: str) -> None:
        """Report an attach failure in ``status.attachError``."""
        self._update_status(name, {"attached": False,
                                   "attachError": {"message": message, "time": _now()}})

    def set_detach_error(self, name: str, message: str) -> None:
        """Report a detach failure in ``status.detachError``."""
        self._update_status(name, {"detachError": {"message": message, "time": _now()}})

    def finish_detach(self, name: str) -> None:
        """Remove a VolumeAttachment held by ``hold_detach`` (its finalizer is done)."""
        with self._lock:
            self._objects.pop(("volumeattachments", "", name), None)

    def _update_status(self, name: str, status: Mapping[str, Any]) -> None:
        with self._lock:
            obj = self._objects.get(("volumeattachments", "", name))
            if obj is None:
                raise KeyError(f"no VolumeAttachment {name}")
            _merge(obj.setdefault("status", {}), status)
            self._bump(obj)

    # --- the store --------------------------------------------------------------------

    def _bump(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    def _store(self, resource: str, namespace: str, data: dict[str, Any]) -> dict[str, Any]:
        api_version, kind, _ = _KINDS[resource]
        meta = data.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise APIStatusError(422, "Invalid", f"{kind}.metadata.name: Required value",
                                 {"kind": resource})
        data["apiVersion"], data["kind"] = api_version, kind
        with self._lock:
            key = (resource, namespace, name)
            if key in self._objects:
                raise _already_exists(resource, name)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            if namespace:
                meta["namespace"] = namespace
            if resource == "volumeattachments":
                data.setdefault("status", {"attached": False})
                if self.auto_attach:
                    data["status"] = {"attached": True,
                                      "attachmentMetadata": dict(self.attach_metadata)}
            self._bump(data)
            self._objects[key] = data
            stored = copy.deepcopy(data)
        if self.on_create is not None:
            self.on_create(resource, stored)
        return stored

    # --- HTTP -------------------------------------------------------------------------

    def _dispatch(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        method = req.command.upper()
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append((method, path))
            failure = next((f for f in self._failures if f[:2] == (method, path)), None)
            if failure is not None:
                self._failures.remove(failure)
        try:
            if failure is not None:
                raise APIStatusError(failure[2], HTTPStatus(failure[2]).phrase.replace(" ", ""),
                                     f"injected failure for {method} {path}", {})
            code, body = self._route(method, path, json.loads(raw) if raw else None)
        except APIStatusError as exc:
            code, body = exc.code, exc.body()
        except ValueError as exc:
            err = APIStatusError(400, "BadRequest", f"cannot decode the body: {exc}", {})
            code, body = 400, err.body()
        payload = json.dumps(body).encode()
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(payload)))
        req.end_headers()
        req.wfile.write(payload)

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        for pattern, kind in _ROUTES:
            match = pattern.match(path)
            if match is None:
                continue
            groups = match.groups()
            if kind == "collection":
                return self._collection(method, groups[0], "", body)
            if kind == "object":
                return self._object(method, groups[0], "", groups[1], body)
            if kind == "status":
                return self._status(method, groups[1], body)
            if kind == "ns-collection":
                return self._collection(method, groups[1], groups[0], body)
            if kind == "token":
                return self._token(method, groups[0], groups[1], body)
            return self._object(method, groups[1], groups[0], groups[2], body)
        raise APIStatusError(404, "NotFound", f"the server could not find the requested "
                                              f"resource ({method} {path})", {})

    def _collection(self, method: str, resource: str, namespace: str, body: Any) -> tuple[int, Any]:
        api_version, kind, _ = _KINDS[resource]
        if method == "GET":
            with self._lock:
                items = [copy.deepcopy(o) for (r, ns, _), o in sorted(self._objects.items())
                         if r == resource and ns == namespace]
                version = str(self._version)
            return 200, {"kind": f"{kind}List", "apiVersion": api_version,
                         "metadata": {"resourceVersion": version}, "items": items}
        if method == "POST":
            if not isinstance(body, dict):
                raise APIStatusError(400, "BadRequest", "the body must be an object", {})
            if resource == "csidrivers":
                default_csidriver(body)
            return 201, self._store(resource, namespace, body)
        raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported", {})

    def _object(
        self, method: str, resource: str, namespace: str, name: str, body: Any
    ) -> tuple[int, Any]:
        key = (resource, namespace, name)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                raise _not_found(resource, name)
            if method == "GET":
                return 200, copy.deepcopy(obj)
            if method == "DELETE":
                if resource == "volumeattachments" and self.hold_detach:
                    obj["metadata"].setdefault("deletionTimestamp", _now())
                    self._bump(obj)
                    return 200, copy.deepcopy(obj)
                del self._objects[key]
                return 200, copy.deepcopy(obj)
        raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported", {})

    def _token(self, method: str, namespace: str, sa: str, body: Any) -> tuple[int, Any]:
        if method != "POST":
            raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported", {})
        if not isinstance(body, dict) or body.get("kind") not in (None, "TokenRequest"):
            raise APIStatusError(400, "BadRequest", "the body must be a TokenRequest", {})
        with self._lock:
            if ("serviceaccounts", namespace, sa) not in self._objects:
                raise _not_found("serviceaccounts", sa)
        spec = dict(body.get("spec") or {})
        spec["expirationSeconds"] = spec.get("expirationSeconds") or _DEFAULT_TOKEN_SECONDS
        spec.setdefault("audiences", [])
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
            seconds=int(spec["expirationSeconds"]))
        token = self.token_factory(namespace, sa, spec)
        with self._lock:
            self.token_requests.append((namespace, sa, copy.deepcopy(body)))
        return 201, {
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": sa, "namespace": namespace, "creationTimestamp": _now()},
            "spec": spec,
            "status": {"token": token,
                       "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")},
        }

    def _status(self, method: str, name: str, body: Any) -> tuple[int, Any]:
        key = ("volumeattachments", "", name)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                raise _not_found("volumeattachments", name)
            if method == "GET":
                return 200, copy.deepcopy(obj)
            if method in ("PUT", "PATCH") and isinstance(body, dict):
                if method == "PUT":
                    obj["status"] = copy.deepcopy(body.get("status") or {})
                else:
                    _merge(obj, {"status": body.get("status") or {}})
                self._bump(obj)
                return 200, copy.deepcopy(obj)
        raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported", {})
