"""A stand-in Kubernetes API server on loopback, for testing code that talks to the API with
the official ``kubernetes`` client: the real paths, verbs, object shapes and error
``Status`` objects for the resources kubevol's CSI code uses.

Served: CSIDrivers, VolumeAttachments and CSINodes (``storage.k8s.io/v1``: list, get,
create, update, delete; VolumeAttachment status get/put/patch), Secrets, ConfigMaps, Pods
and PersistentVolumeClaims (``v1``, namespaced; Pods also listed across namespaces),
PersistentVolumes and Nodes (``v1``; a Node's metadata and ``status`` take merge patches),
and the TokenRequest subresource of ServiceAccounts (``POST …/serviceaccounts/<sa>/token``:
a token bound to the pod named in the request, for an existing ServiceAccount).

Lists and watches follow the API's resourceVersion rules: every change gets the next
resourceVersion (one counter for every object, as etcd's revision); a list answers the
current one; ``?watch=true`` streams JSON events (``{"type": "ADDED"|"MODIFIED"|"DELETED"|
"BOOKMARK"|"ERROR", "object": …}``, one per line, chunked) — from a given resourceVersion
it replays the later changes, without one (or with ``0``) it first sends the current objects
as ADDED; a resourceVersion older than the retained window (``event_window`` changes, or
everything before :meth:`KubeAPIServer.compact`) is answered, in a 200 stream, by an ERROR
event carrying the ``410 Expired`` Status ``too old resource version: R (oldest-1)``, as the
watch cache does. ``fieldSelector`` (``spec.nodeName``, ``metadata.name``,
``metadata.namespace``; ``=``, ``==``, ``!=``) filters lists and watches; a watched object
that stops matching is sent as DELETED and one that starts matching as ADDED. BOOKMARK
events (``allowWatchBookmarks=true``) carry only ``apiVersion``, ``kind`` and
``metadata.resourceVersion``; the test sends them with :meth:`~KubeAPIServer.send_bookmark`.
:meth:`~KubeAPIServer.drop_watches` cuts every open watch connection mid-stream (no final
chunk), as a restarting API server or a broken network does; ``timeoutSeconds`` ends a
watch cleanly.

It is NOT an API server: no label selectors, no admission or validation beyond names,
objects are kept in memory.

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
import collections
import copy
import datetime
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import attrs

from kubevol.util.lifecycle import RunsWhileEntered

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from kubevol.node.manifests import ApiDict, ApiObject

_STORAGE = "/apis/storage.k8s.io/v1"
_CLUSTER = "csidrivers|volumeattachments|csinodes"
_CORE_CLUSTER = "persistentvolumes|nodes"
_NAMESPACED = "secrets|configmaps|pods|persistentvolumeclaims|events"
_ROUTES = [
    (re.compile(rf"^{_STORAGE}/({_CLUSTER})$"), "collection"),
    (re.compile(rf"^{_STORAGE}/({_CLUSTER})/([^/]+)$"), "object"),
    (re.compile(rf"^{_STORAGE}/(volumeattachments)/([^/]+)/status$"), "status"),
    (re.compile(rf"^/api/v1/({_CORE_CLUSTER})$"), "collection"),
    (re.compile(rf"^/api/v1/({_CORE_CLUSTER})/([^/]+)$"), "object"),
    (re.compile(r"^/api/v1/(nodes)/([^/]+)/status$"), "object"),
    (re.compile(r"^/api/v1/(pods)$"), "all-namespaces"),
    (re.compile(rf"^/api/v1/namespaces/([^/]+)/({_NAMESPACED})$"), "ns-collection"),
    (re.compile(rf"^/api/v1/namespaces/([^/]+)/({_NAMESPACED})/([^/]+)$"), "ns-object"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/serviceaccounts/([^/]+)/token$"), "token"),
]
_KINDS = {
    "csidrivers": ("storage.k8s.io/v1", "CSIDriver", "storage.k8s.io"),
    "volumeattachments": ("storage.k8s.io/v1", "VolumeAttachment", "storage.k8s.io"),
    "csinodes": ("storage.k8s.io/v1", "CSINode", "storage.k8s.io"),
    "secrets": ("v1", "Secret", ""),
    "configmaps": ("v1", "ConfigMap", ""),
    "serviceaccounts": ("v1", "ServiceAccount", ""),
    "pods": ("v1", "Pod", ""),
    "persistentvolumeclaims": ("v1", "PersistentVolumeClaim", ""),
    "persistentvolumes": ("v1", "PersistentVolume", ""),
    "nodes": ("v1", "Node", ""),
    "events": ("v1", "Event", ""),
}
#: The fields a fieldSelector may name, by resource (what the API server's field label
#: conversion accepts for them; every resource takes metadata.name/namespace).
_SELECTABLE = {"pods": ("spec.nodeName",)}
#: How many changes a watch can be resumed across before "too old resource version".
DEFAULT_EVENT_WINDOW = 1000
#: A watch without timeoutSeconds ends after this long (the API server's
#: --min-request-timeout; it picks a random time between it and twice it).
DEFAULT_WATCH_TIMEOUT = 1800.0
#: What the API defaults a TokenRequest's expirationSeconds to.
_DEFAULT_TOKEN_SECONDS = 3600


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class APIStatusError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, object]) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.details = dict(details)

    def body(self) -> dict[str, object]:
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


def _object_error(code: int, reason: str, resource: str, name: str,
                  message: str) -> APIStatusError:
    """An error about one object: ``message`` with ``{qualified}`` (``resource.group``, or
    the resource of the core group) and ``{name}`` filled in, and the details naming it."""
    group = _KINDS[resource][2]
    qualified = f"{resource}.{group}" if group else resource
    return APIStatusError(code, reason, message.format(qualified=qualified, name=name),
                          {"name": name, "group": group, "kind": resource})


def _not_found(resource: str, name: str) -> APIStatusError:
    return _object_error(404, "NotFound", resource, name, '{qualified} "{name}" not found')


def _already_exists(resource: str, name: str) -> APIStatusError:
    return _object_error(409, "AlreadyExists", resource, name,
                         '{qualified} "{name}" already exists')


def default_csidriver(obj: ApiDict) -> ApiDict:
    """What storage/v1 defaulting does to a CSIDriver on create (kubernetes/kubernetes
    ``pkg/apis/storage/v1/defaults.go``, ``SetDefaults_CSIDriver``)."""
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


def _conflict(resource: str, name: str) -> APIStatusError:
    return _object_error(
        409, "Conflict", resource, name,
        'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
    )


def expired_status(resource_version: int, oldest: int) -> dict[str, object]:
    """The Status a watch from a compacted resourceVersion gets (the watch cache's
    ``NewResourceExpired``), inside an ERROR event of a 200 stream."""
    return APIStatusError(410, "Expired",
                          f"too old resource version: {resource_version} ({oldest})", {}).body()


@attrs.frozen
class _Event:
    """One change: its resourceVersion, type, where, the object after (before, for DELETED)
    and, for MODIFIED, the object before."""

    rv: int
    type: str
    resource: str
    namespace: str
    obj: ApiDict
    old: ApiDict | None = None


@attrs.frozen
class FieldSelector:
    """A parsed ``fieldSelector``: ``(field, equal?, value)`` terms, all of which must hold."""

    terms: tuple[tuple[str, bool, str], ...] = ()

    @classmethod
    def parse(cls, text: str, resource: str) -> FieldSelector:
        """Raises a 400 APIStatusError for a malformed term or a field the resource does
        not support (the API server's ``field label not supported``)."""
        terms = []
        for part in filter(None, text.split(",")):
            op = next((o for o in ("!=", "==", "=") if o in part), None)
            if op is None:
                raise APIStatusError(400, "BadRequest", f"invalid selector: '{text}'", {})
            field, value = part.split(op, 1)
            equal = op != "!="
            if field not in ("metadata.name", "metadata.namespace",
                             *_SELECTABLE.get(resource, ())):
                raise APIStatusError(400, "BadRequest",
                                     f'"{field}" is not a known field selector: only '
                                     '"metadata.name", "metadata.namespace"', {})
            terms.append((field, equal, value))
        return cls(tuple(terms))

    def matches(self, obj: ApiObject | None) -> bool:
        """Whether ``obj`` has every selected field value (None never matches)."""
        if obj is None:
            return False
        for field, equal, value in self.terms:
            found: object = obj
            for part in field.split("."):
                found = found.get(part) if isinstance(found, Mapping) else None
            if ((found or "") == value) != equal:
                return False
        return True


def _merge(target: ApiDict, patch: ApiObject) -> None:
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
    ``event_window``: how many changes are kept for watches to resume from.
    """

    def __init__(
        self,
        *,
        auto_attach: bool = False,
        attach_metadata: Mapping[str, str] | None = None,
        hold_detach: bool = False,
        event_window: int = DEFAULT_EVENT_WINDOW,
        watch_timeout: float = DEFAULT_WATCH_TIMEOUT,
    ) -> None:
        self.auto_attach = auto_attach
        self.attach_metadata = dict(attach_metadata or {})
        self.hold_detach = hold_detach
        self.watch_timeout = watch_timeout
        self._objects: dict[tuple[str, str, str], ApiDict] = {}
        self._version = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._events: collections.deque[_Event] = collections.deque()
        self._event_window = event_window
        #: The newest resourceVersion whose change is no longer kept (watches from an older
        #: one are told 410 Expired).
        self._compacted = 0
        self._bookmarks = 0
        self._drops = 0
        self._stopping = False
        #: Watches open now.
        self.open_watches = 0
        self.requests: list[tuple[str, str]] = []
        #: Every request with its query parameters (first value of each).
        self.queries: list[tuple[str, str, dict[str, str]]] = []
        self._failures: list[tuple[str, str, int]] = []
        self.on_create: Callable[[str, ApiDict], None] | None = None
        #: TokenRequests answered, as (namespace, service account, request body).
        self.token_requests: list[tuple[str, str, ApiDict]] = []
        #: Makes the token for a request: (namespace, service account, spec) → token.
        self.token_factory: Callable[[str, str, ApiObject], str] = (
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

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: tests read :attr:`KubeAPIServer.requests` instead."""

            def _serve(self) -> None:
                server._dispatch(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        with self._lock:
            self._stopping = False
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

    def api_client(self) -> ApiClient:
        """A ``kubernetes.client.ApiClient`` pointed at this server."""
        from kubernetes.client import ApiClient, Configuration

        config = Configuration()
        config.host = self.url
        return ApiClient(config)

    def write_kubeconfig(self, path: str) -> str:
        """Write a kubeconfig file for this server at ``path`` (for ``--kubeconfig``)."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {"token": "stand-in-token"}}],
            "contexts": [{"name": "stand-in",
                          "context": {"cluster": "stand-in", "user": "stand-in"}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)  # JSON is YAML: the client's loader reads it
        return path

    def stop(self) -> None:
        """Stop serving (open watches end). Idempotent."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
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

    def add_csidriver(self, obj: ApiObject, *, defaults: bool = True) -> ApiDict:
        """Store a CSIDriver (dict form), defaulted like the API server unless told not to."""
        data = copy.deepcopy(dict(obj))
        if defaults:
            default_csidriver(data)
        return self._store("csidrivers", "", data)

    def add_secret(self, namespace: str, name: str, data: Mapping[str, str]) -> ApiDict:
        """Store a Secret whose ``data`` are the given plain strings (base64-encoded here)."""
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        return self._store("secrets", namespace,
                           {"metadata": {"name": name, "namespace": namespace}, "data": encoded})

    def add_config_map(
        self, namespace: str, name: str, data: Mapping[str, str],
        binary_data: Mapping[str, bytes] | None = None,
    ) -> ApiDict:
        """Store a ConfigMap (``binary_data`` given as bytes, base64-encoded here)."""
        obj: ApiDict = {"metadata": {"name": name, "namespace": namespace},
                        "data": dict(data)}
        if binary_data:
            obj["binaryData"] = {k: base64.b64encode(v).decode() for k, v in binary_data.items()}
        return self._store("configmaps", namespace, obj)

    def add_service_account(self, namespace: str, name: str) -> ApiDict:
        """Store a ServiceAccount (TokenRequests for it are then answered)."""
        return self._store("serviceaccounts", namespace,
                           {"metadata": {"name": name, "namespace": namespace}})

    def add(self, obj: ApiObject) -> ApiDict:
        """Store any served object given as its API dict (a Pod, PersistentVolume, Claim,
        Node …; its ``kind`` says which); the stored copy, with uid and resourceVersion."""
        data = copy.deepcopy(dict(obj))
        resource = next((r for r, (_, kind, _) in _KINDS.items() if kind == data.get("kind")),
                        None)
        if resource is None:
            raise ValueError(f"kind {data.get('kind')!r} is not served")
        namespace = ""
        if resource in _NAMESPACED.split("|"):
            namespace = (data.get("metadata") or {}).get("namespace") or "default"
        return self._store(resource, namespace, data)

    def add_node(self, name: str, labels: Mapping[str, str] | None = None) -> ApiDict:
        """Store a Node."""
        return self._store("nodes", "", {"metadata": {"name": name, "labels": dict(labels or {})}})

    def update(
        self, resource: str, name: str, patch: ApiObject, namespace: str = ""
    ) -> ApiDict:
        """Apply a JSON merge patch to a stored object (as a controller would: a MODIFIED
        change with the next resourceVersion); the stored copy."""
        with self._lock:
            obj = self._objects.get((resource, namespace, name))
            if obj is None:
                raise _not_found(resource, name)
            old = copy.deepcopy(obj)
            _merge(obj, patch)
            self._bump(obj, "MODIFIED", resource, namespace, old)
            return copy.deepcopy(obj)

    def delete(self, resource: str, name: str, namespace: str = "") -> None:
        """Remove a stored object (as if deleted in the cluster)."""
        with self._lock:
            obj = self._objects.pop((resource, namespace, name), None)
            if obj is not None:
                self._bump(obj, "DELETED", resource, namespace)

    def get(self, resource: str, name: str, namespace: str = "") -> ApiDict | None:
        """A copy of a stored object, or None."""
        with self._lock:
            found = self._objects.get((resource, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def names(self, resource: str) -> list[str]:
        """Names of the stored objects of ``resource``."""
        with self._lock:
            return sorted(n for (r, _, n) in self._objects if r == resource)

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion."""
        with self._lock:
            return self._version

    def compact(self) -> int:
        """Forget every change made so far (as etcd compaction and a full watch cache do):
        a watch from any resourceVersion up to now is answered 410 Expired. Returns the
        newest forgotten resourceVersion."""
        with self._lock:
            self._events.clear()
            self._compacted = self._version
            return self._compacted

    def send_bookmark(self) -> None:
        """Send a BOOKMARK (the current resourceVersion) to every watch that allows them."""
        with self._changed:
            self._bookmarks += 1
            self._changed.notify_all()

    def drop_watches(self) -> None:
        """Cut every open watch connection without ending its stream."""
        with self._changed:
            self._drops += 1
            self._changed.notify_all()

    def wait_for_watches(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until ``count`` watches are open; whether they are."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.open_watches < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

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
        self.delete("volumeattachments", name)

    def _update_status(self, name: str, status: ApiObject) -> None:
        with self._lock:
            obj = self._objects.get(("volumeattachments", "", name))
            if obj is None:
                raise KeyError(f"no VolumeAttachment {name}")
            old = copy.deepcopy(obj)
            _merge(obj.setdefault("status", {}), status)
            self._bump(obj, "MODIFIED", "volumeattachments", "", old)

    # --- the store (callers hold the lock) ---------------------------------------------

    def _bump(
        self, obj: ApiDict, event: str, resource: str, namespace: str,
        old: ApiDict | None = None,
    ) -> None:
        """Give ``obj`` the next resourceVersion and keep the change for watches."""
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self._events.append(_Event(self._version, event, resource, namespace,
                                   copy.deepcopy(obj), old))
        while len(self._events) > self._event_window:
            self._compacted = self._events.popleft().rv
        self._changed.notify_all()

    def _store(self, resource: str, namespace: str, data: ApiDict) -> ApiDict:
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
            meta.pop("resourceVersion", None)
            if namespace:
                meta["namespace"] = namespace
            if resource == "volumeattachments":
                data.setdefault("status", {"attached": False})
                if self.auto_attach:
                    data["status"] = {"attached": True,
                                      "attachmentMetadata": dict(self.attach_metadata)}
            self._bump(data, "ADDED", resource, namespace)
            self._objects[key] = data
            stored = copy.deepcopy(data)
        if self.on_create is not None:
            self.on_create(resource, stored)
        return stored

    # --- HTTP -------------------------------------------------------------------------

    def _dispatch(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        path = parts.path
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        method = req.command.upper()
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append((method, path))
            self.queries.append((method, path, query))
            failure = next((f for f in self._failures if f[:2] == (method, path)), None)
            if failure is not None:
                self._failures.remove(failure)
        try:
            if failure is not None:
                raise APIStatusError(failure[2], HTTPStatus(failure[2]).phrase.replace(" ", ""),
                                     f"injected failure for {method} {path}", {})
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._watch(req, path, query)
                return
            code, body = self._route(method, path, json.loads(raw) if raw else None, query)
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

    @staticmethod
    def _match(method: str, path: str) -> tuple[str, tuple[str, ...]]:
        """The route kind of ``path`` and the parts its pattern captured (the patterns are
        anchored and exclusive); a 404 Status for a path no route serves."""
        for pattern, kind in _ROUTES:
            match = pattern.match(path)
            if match is not None:
                return kind, match.groups()
        raise APIStatusError(404, "NotFound", f"the server could not find the requested "
                                              f"resource ({method} {path})", {})

    def _collection_of(self, path: str) -> tuple[str, str | None]:
        """(resource, namespace or None for every namespace) of a collection path."""
        kind, groups = self._match("GET", path)
        if kind in ("collection", "all-namespaces"):
            return groups[0], (None if kind == "all-namespaces" else "")
        if kind == "ns-collection":
            return groups[1], groups[0]
        raise APIStatusError(404, "NotFound", f"the server could not find the requested "
                                              f"resource (GET {path})", {})

    def _route(
        self, method: str, path: str, body: object, query: Mapping[str, str]
    ) -> tuple[int, object]:
        kind, groups = self._match(method, path)
        if kind == "collection":
            return self._collection(method, groups[0], "", body, query)
        if kind == "all-namespaces":
            return self._collection(method, groups[0], None, body, query)
        if kind == "object":
            return self._object(method, groups[0], "", groups[1], body)
        if kind == "status":
            return self._status(method, groups[1], body)
        if kind == "ns-collection":
            return self._collection(method, groups[1], groups[0], body, query)
        if kind == "token":
            return self._token(method, groups[0], groups[1], body)
        return self._object(method, groups[1], groups[0], groups[2], body)

    def _collection(
        self, method: str, resource: str, namespace: str | None, body: object,
        query: Mapping[str, str],
    ) -> tuple[int, object]:
        api_version, kind, _ = _KINDS[resource]
        if method == "GET":
            selector = FieldSelector.parse(query.get("fieldSelector", ""), resource)
            with self._lock:
                items = [copy.deepcopy(o) for (r, ns, _), o in sorted(self._objects.items())
                         if r == resource and namespace in (None, ns) and selector.matches(o)]
                version = str(self._version)
            return 200, {"kind": f"{kind}List", "apiVersion": api_version,
                         "metadata": {"resourceVersion": version}, "items": items}
        if method == "POST" and namespace is not None:
            if not isinstance(body, dict):
                raise APIStatusError(400, "BadRequest", "the body must be an object", {})
            if resource == "csidrivers":
                default_csidriver(body)
            return 201, self._store(resource, namespace, body)
        raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported", {})

    def _object(
        self, method: str, resource: str, namespace: str, name: str, body: object
    ) -> tuple[int, object]:
        key = (resource, namespace, name)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                raise _not_found(resource, name)
            if method == "GET":
                return 200, copy.deepcopy(obj)
            if method == "DELETE":
                if resource == "volumeattachments" and self.hold_detach:
                    old = copy.deepcopy(obj)
                    obj["metadata"].setdefault("deletionTimestamp", _now())
                    self._bump(obj, "MODIFIED", resource, namespace, old)
                    return 200, copy.deepcopy(obj)
                del self._objects[key]
                self._bump(obj, "DELETED", resource, namespace)
                return 200, copy.deepcopy(obj)
            if method == "PUT" and isinstance(body, dict):
                # Update: optimistic concurrency on metadata.resourceVersion, as the API.
                meta = body.get("metadata") or {}
                if meta.get("name") not in (None, name):
                    raise APIStatusError(400, "BadRequest", "the name of the object does "
                                         "not match the name on the URL", {})
                given = meta.get("resourceVersion")
                if given and given != obj["metadata"]["resourceVersion"]:
                    raise _conflict(resource, name)
                old = copy.deepcopy(obj)
                new = copy.deepcopy(body)
                new["apiVersion"], new["kind"] = obj["apiVersion"], obj["kind"]
                new["metadata"] = {**meta, "name": name, "uid": obj["metadata"]["uid"],
                                   "creationTimestamp": obj["metadata"]["creationTimestamp"]}
                if namespace:
                    new["metadata"]["namespace"] = namespace
                obj.clear()
                obj.update(new)
                self._bump(obj, "MODIFIED", resource, namespace, old)
                return 200, copy.deepcopy(obj)
            if method == "PATCH" and isinstance(body, dict):
                # Merge and strategic-merge patches agree on maps (labels, annotations).
                old = copy.deepcopy(obj)
                _merge(obj, body)
                self._bump(obj, "MODIFIED", resource, namespace, old)
                return 200, copy.deepcopy(obj)
        raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported", {})

    def _token(self, method: str, namespace: str, sa: str, body: object) -> tuple[int, object]:
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

    def _status(self, method: str, name: str, body: object) -> tuple[int, object]:
        key = ("volumeattachments", "", name)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                raise _not_found("volumeattachments", name)
            if method == "GET":
                return 200, copy.deepcopy(obj)
            if method in ("PUT", "PATCH") and isinstance(body, dict):
                old = copy.deepcopy(obj)
                if method == "PUT":
                    obj["status"] = copy.deepcopy(body.get("status") or {})
                else:
                    _merge(obj, {"status": body.get("status") or {}})
                self._bump(obj, "MODIFIED", "volumeattachments", "", old)
                return 200, copy.deepcopy(obj)
        raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported", {})

    # --- watch ------------------------------------------------------------------------

    def _watch(self, req: BaseHTTPRequestHandler, path: str, query: Mapping[str, str]) -> None:
        """Stream the changes of a collection as watch events until timeoutSeconds, a
        drop, or the server stopping."""
        resource, namespace = self._collection_of(path)
        selector = FieldSelector.parse(query.get("fieldSelector", ""), resource)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(query.get("timeoutSeconds") or self.watch_timeout)
        since = query.get("resourceVersion") or "0"
        if not since.isdigit():
            raise APIStatusError(400, "BadRequest", f"invalid resource version: {since}", {})
        position = int(since)
        with self._lock:
            drops, marks = self._drops, self._bookmarks
            initial: list[dict[str, object]] = []
            if position == 0:
                # No resourceVersion: the current state as ADDED events, then the changes.
                position = self._version
                initial = [{"type": "ADDED", "object": copy.deepcopy(o)}
                           for (r, ns, _), o in sorted(self._objects.items())
                           if r == resource and namespace in (None, ns) and selector.matches(o)]
            expired = position < self._compacted
            compacted = self._compacted
            self.open_watches += 1
            self._changed.notify_all()
        try:
            req.send_response(200)
            req.send_header("Content-Type", "application/json")
            req.send_header("Transfer-Encoding", "chunked")
            req.end_headers()
            if expired:
                self._send(req, {"type": "ERROR", "object": expired_status(position, compacted)})
                self._end(req)
                return
            for added in initial:
                self._send(req, added)
            self._stream(req, resource, namespace, selector, position,
                         bookmarks=bookmarks, drops=drops, marks=marks,
                         deadline=time.monotonic() + timeout)
        except OSError:
            return  # the client went away
        finally:
            with self._changed:
                self.open_watches -= 1
                self._changed.notify_all()

    def _stream(
        self, req: BaseHTTPRequestHandler, resource: str, namespace: str | None,
        selector: FieldSelector, position: int, *, bookmarks: bool, drops: int, marks: int,
        deadline: float,
    ) -> None:
        """Send the changes after ``position`` as they come (see :meth:`_watch`)."""
        api_version, kind, _ = _KINDS[resource]
        while True:
            with self._changed:
                while True:
                    pending = [e for e in self._events if e.rv > position]
                    dropped = self._drops != drops
                    bookmark = bookmarks and self._bookmarks != marks
                    left = deadline - time.monotonic()
                    if pending or dropped or bookmark or left <= 0 or self._stopping:
                        break
                    self._changed.wait(min(left, 0.5))
                lost = position < self._compacted
                compacted, version, marks = self._compacted, self._version, self._bookmarks
            if dropped:
                # Cut the connection mid-stream: no final chunk.
                req.close_connection = True
                req.connection.shutdown(socket.SHUT_RDWR)
                return
            if lost:
                self._send(req, {"type": "ERROR",
                                 "object": expired_status(position, compacted)})
                self._end(req)
                return
            for change in pending:
                event = (self._visible(change, namespace, selector)
                         if change.resource == resource else None)
                if event is not None:
                    self._send(req, event)
                position = change.rv
            if bookmark:
                position = max(position, version)
                self._send(req, {"type": "BOOKMARK", "object": {
                    "kind": kind, "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(position)}}})
            if time.monotonic() >= deadline or self._stopping:
                self._end(req)
                return

    @staticmethod
    def _visible(
        change: _Event, namespace: str | None, selector: FieldSelector
    ) -> dict[str, object] | None:
        """The event a watcher with this namespace and selector sees for ``change``."""
        if namespace not in (None, change.namespace):
            return None
        now = selector.matches(change.obj)
        before = change.old is not None and selector.matches(change.old)
        if change.type == "MODIFIED" and before and not now and change.old is not None:
            # Stopped matching: the watcher is told it is gone (with the new version).
            gone = copy.deepcopy(change.old)
            gone["metadata"]["resourceVersion"] = str(change.rv)
            return {"type": "DELETED", "object": gone}
        if not now:
            return None
        kind = "ADDED" if change.type == "MODIFIED" and change.old is not None and not before \
            else change.type
        return {"type": kind, "object": copy.deepcopy(change.obj)}

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, event: Mapping[str, object]) -> None:
        data = json.dumps(event).encode() + b"\n"
        req.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        req.wfile.flush()

    @staticmethod
    def _end(req: BaseHTTPRequestHandler) -> None:
        req.wfile.write(b"0\r\n\r\n")
        req.wfile.flush()
