"""Pods bound to this node on a Kubernetes API server: the agent's ``--kubeconfig`` source.

A thread lists the pods with the field selector ``spec.nodeName=<node>`` and then watches
them from the list's resourceVersion, as a client-go reflector does: a watch that ends
(the server's ``timeoutSeconds``) or breaks (network, API server restart) is resumed from
the last resourceVersion seen (object or BOOKMARK event), and a resourceVersion the server
no longer has (``410 Gone``/``Expired``, an ERROR event or an error answer) makes it list
again. Other failures are retried with a backoff; the last known pods are kept meanwhile.

What is desired: every pod of the node that is not in a terminal phase (``Succeeded``,
``Failed``) and not being deleted (``deletionTimestamp``: there are no containers to wait
for; kubevol's volumes go as soon as the API says the pod goes). Their claims are read from
the API server (``PersistentVolumeClaim`` → its bound ``PersistentVolume``) once per pod (a
pod's volumes cannot change); ConfigMaps and Secrets are read when a volume is set up,
through the runtime's object source. Until the first list succeeded the source is not
:attr:`~APIServerPods.synced`: the agent must not take anything down because of it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kubevol.errors import KubevolError, SpecError
from kubevol.node.manifests import Manifests, claim_name, manifest_pod_uid, namespace_of
from kubevol.node.owners import PodBindings
from kubevol.node.owners import is_running as may_run
from kubevol.node.validation import validate_pod
from kubevol.util.backoff import Backoff
from kubevol.util.lifecycle import ClosesOnExit

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api
    from kubernetes.watch import Watch

log = logging.getLogger(__name__)

#: How long one watch request lasts before it is resumed (the server ends it cleanly).
WATCH_TIMEOUT = 300
#: How often pods whose claims could not be read are tried again (seconds).
RESOLVE_RETRY = 2.0


def _field(obj: Mapping[str, object], key: str) -> Mapping[str, object]:
    """``obj[key]`` (an API object's ``metadata``, ``spec``), empty when it is not set."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _clean(obj: Mapping[str, object]) -> dict[str, object]:
    """The object without what changes on every status update (status, resourceVersion,
    managedFields): a record is rewritten only when the pod itself changes."""
    out = {k: v for k, v in obj.items() if k != "status"}
    meta = {k: v for k, v in _field(obj, "metadata").items()
            if k not in ("resourceVersion", "managedFields")}
    out["metadata"] = meta
    return out


def is_running(pod: Mapping[str, object]) -> bool:
    """Whether the pod still wants its volumes: not terminal, not being deleted."""
    return may_run(pod) and not _field(pod, "metadata").get("deletionTimestamp")


class APIServerPods(ClosesOnExit, PodBindings):
    """The pods of node ``node_name`` on the API server of ``api_client`` (a
    ``kubernetes.client.ApiClient``), kept current by :meth:`start`'s thread.

    Thread-safe. :meth:`wait` tells the agent when they changed; :meth:`manifests` gives
    the running ones with their claims and volumes; :attr:`errors` says which pods cannot
    be run (their claims could not be read) and :meth:`unresolved` which UIDs those are
    (kept running if they ran: a failed read is no reason to tear a pod down).
    """

    def __init__(
        self, api_client: ApiClient, node_name: str, *, watch_timeout: int = WATCH_TIMEOUT,
        backoff: Backoff | None = None,
    ) -> None:
        self.api_client = api_client
        self.node_name = node_name
        self.watch_timeout = watch_timeout
        self.selector = f"spec.nodeName={node_name}"
        self._backoff = backoff or Backoff(initial=0.5, maximum=30.0)
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, object]] = {}
        #: Every pod UID listed on this node since the start (never a static pod's: a
        #: mirror pod has a UID of its own).
        self._listed: set[str] = set()
        self._claims: dict[str, Manifests] = {}
        self._unresolved: set[str] = set()
        self._retry_at = 0.0
        self._changed = threading.Event()
        #: Called (on the watch thread) whenever the pods changed: a waiter elsewhere wakes.
        self.on_change: Callable[[], None] = lambda: None
        self._stop = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        #: Set once a list succeeded: the pods are the API server's.
        self.synced = threading.Event()
        #: The last resourceVersion seen (None: the next request is a list).
        self.resource_version: str | None = None
        #: How many lists and watch requests were made (a relist after 410 is one more list).
        self.lists = 0
        self.watches = 0
        #: Why pods cannot be run, by ``pod namespace/name``.
        self.errors: dict[str, str] = {}

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> APIServerPods:
        """List and watch in a background thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kubevol-api-pods",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        # As client-go's reflector: a watch that ends is resumed at once unless it was "very
        # short" (under a second, no event). That, a 410 (relist) and failures wait out a
        # backoff (client-go's 0.8 s doubling to 30 s for the first two, ``backoff`` for
        # failures), which a watch that delivered events or lasted resets.
        relist, short_watch = Backoff(initial=0.8, maximum=30.0), 1.0
        failures = 0
        while not self._stop.is_set():
            since: str | None = None
            started = time.monotonic()
            expired = False
            why: str | None = None
            try:
                if self.resource_version is None:
                    self._list()
                since, started = self.resource_version, time.monotonic()
                self._watch_once()
            except ApiException as exc:
                expired = exc.status == 410
                why = f"API status {exc.status} {exc.reason}"
            except (HTTPError, OSError, ValueError, KubevolError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            if since is not None and (self.resource_version != since
                                      or time.monotonic() - started >= short_watch):
                failures = 0  # the watch ran: earlier failures are forgotten
                if why is None:
                    continue
            if expired:
                delay = relist.delay(failures)
                log.info("pods of node %s: resourceVersion %s is too old; listing again in "
                         "%.1f s", self.node_name, self.resource_version, delay)
                self.resource_version = None
            elif why is None:
                delay = relist.delay(failures)
                log.info("pods of node %s: the watch ended at once without an event; watching "
                         "again in %.1f s", self.node_name, delay)
            else:
                delay = self._backoff.delay(failures)
                log.warning("pods of node %s: %s; retrying in %.1f s (from resourceVersion %s)",
                            self.node_name, why, delay, self.resource_version or "none: relist")
            failures += 1
            self._stop.wait(delay)

    def _core(self) -> CoreV1Api:
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client)

    def _list(self) -> None:
        resp = self._core().list_pod_for_all_namespaces(
            field_selector=self.selector, _preload_content=False, _request_timeout=60
        )
        body = json.loads(resp.data)
        self.lists += 1
        pods: dict[str, dict[str, object]] = {}
        for pod in body.get("items") or []:
            try:
                pods[self._uid(pod)] = pod
            except KubevolError as exc:  # one bad pod must not keep the others from running
                log.warning("pods of node %s: %s skipped: %s", self.node_name,
                            self._pod_name(pod), exc)
        with self._lock:
            self._pods = pods
            self._listed |= set(pods)
            self._claims = {u: m for u, m in self._claims.items() if u in pods}
        self.resource_version = str(body["metadata"]["resourceVersion"])
        log.info("pods of node %s: listed %d at resourceVersion %s", self.node_name,
                 len(pods), self.resource_version)
        self.synced.set()
        self._changed.set()
        self.on_change()

    def _watch_once(self) -> None:
        from kubernetes import watch

        core = self._core()

        def list_pods(**kwargs: object) -> object:
            """Without a model type the client's Watch hands out the API's dicts."""
            return core.list_pod_for_all_namespaces(**kwargs)

        w = watch.Watch()
        self._watch = w
        self.watches += 1
        try:
            if self._stop.is_set():
                return
            # timeout_seconds also turns off the Watch helper's own retry: 410 reaches us.
            for event in w.stream(
                list_pods, field_selector=self.selector, resource_version=self.resource_version,
                allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout,
                _request_timeout=(30, self.watch_timeout + 30),
            ):
                self._apply(event["type"], event["raw_object"])
                if self._stop.is_set():
                    return
        finally:
            self._watch = None

    def _apply(self, kind: str, obj: Mapping[str, object]) -> None:
        version = _field(obj, "metadata").get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                uid = self._uid(obj)
            except KubevolError as exc:  # skipped, and the watch goes on past it
                log.warning("pods of node %s: %s skipped: %s", self.node_name,
                            self._pod_name(obj), exc)
                if version:
                    self.resource_version = str(version)
                return
            with self._lock:
                before = self._pods.get(uid)
                if kind == "DELETED":
                    self._pods.pop(uid, None)
                    self._claims.pop(uid, None)
                else:
                    self._pods[uid] = dict(obj)
                    self._listed.add(uid)
            if kind == "DELETED" or before is None or _clean(before) != _clean(obj) \
                    or is_running(before) != is_running(obj):
                self._changed.set()
                self.on_change()
        if version:
            self.resource_version = str(version)

    @staticmethod
    def _uid(pod: Mapping[str, object]) -> str:
        return manifest_pod_uid(pod)

    # -- for the agent --------------------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a change; whether the pods changed (or pods whose
        claims could not be read are due for another try)."""
        with self._lock:
            retry = bool(self._unresolved) and time.monotonic() >= self._retry_at
        if retry or self._changed.wait(max(0.0, timeout)):
            self._changed.clear()
            return True
        return False

    def manifests(self) -> Manifests:
        """The running pods (cleaned of status) with the claims and volumes they use.

        Each pod is checked once, before its claims are read, as a manifest file is
        (:func:`validate_pod`): one the API server should have refused is left out, reported
        in :attr:`errors` with why, and counted :meth:`unresolved` (a pod it ran is not torn
        down for it); the others run."""
        with self._lock:
            pods = {u: p for u, p in self._pods.items() if is_running(p)}
            self._claims = {u: m for u, m in self._claims.items() if u in pods}
            todo = [(u, p) for u, p in pods.items() if u not in self._claims]
        errors: dict[str, str] = {}
        unresolved: set[str] = set()
        for uid, pod in todo:
            try:
                validate_pod(pod, "the API server")
            except SpecError as exc:  # invalid: its claims are not read
                errors[self._pod_name(pod)] = str(exc)
                unresolved.add(uid)
                continue
            try:
                claims = self._read_claims(pod)
            except KubevolError as exc:
                errors[self._pod_name(pod)] = str(exc)
                unresolved.add(uid)
                continue
            with self._lock:
                self._claims[uid] = claims
        out = Manifests()
        with self._lock:
            self._unresolved = unresolved
            self._retry_at = time.monotonic() + RESOLVE_RETRY
            self.errors = errors
            for uid in sorted(pods, key=lambda u: self._pod_name(pods[u])):
                if uid in unresolved:
                    continue
                out = out.merged(self._claims[uid]).merged(Manifests(pods=(_clean(pods[uid]),)))
        return out

    def unresolved(self) -> set[str]:
        """UIDs of the running pods that could not be built (claims unreadable)."""
        with self._lock:
            return set(self._unresolved)

    def gone(self, uid: str) -> bool:
        """Whether the API server listed pod ``uid`` on this node by that UID and now no
        longer lists it, or lists it finished. False until the first list, for a UID it
        never listed, and for a static pod whose mirror pod it lists: see
        :mod:`kubevol.node.owners`."""
        if not self.synced.is_set():
            return False
        with self._lock:
            pod = self._pods.get(uid)
            return uid in self._listed and (pod is None or not may_run(pod))

    def pods(self) -> dict[str, dict[str, object]]:
        """Every pod of the node the API server lists now (running or not), by UID."""
        with self._lock:
            return {u: dict(p) for u, p in self._pods.items()}

    @staticmethod
    def _pod_name(pod: Mapping[str, object]) -> str:
        return f"pod {namespace_of(pod)}/{_field(pod, 'metadata').get('name', '?')}"

    def _read_claims(self, pod: Mapping[str, object]) -> Manifests:
        """The claims of ``pod`` and the PersistentVolumes they are bound to."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        namespace = namespace_of(pod)
        pvcs: dict[tuple[str, str], dict[str, object]] = {}
        pvs: dict[str, dict[str, object]] = {}
        core = self._core()
        volumes = _field(pod, "spec").get("volumes") or []
        # Checked by validate_pod before: a list of mappings.
        for volume in volumes if isinstance(volumes, list) else []:
            claim = claim_name(pod, volume)
            if not claim:
                continue
            try:
                pvc = json.loads(core.read_namespaced_persistent_volume_claim(
                    claim, namespace, _preload_content=False, _request_timeout=30).data)
                volume_name = (pvc.get("spec") or {}).get("volumeName")
                if not volume_name:
                    raise KubevolError(f"claim {namespace}/{claim} is not bound yet")
                pv = json.loads(core.read_persistent_volume(
                    volume_name, _preload_content=False, _request_timeout=30).data)
            except ApiException as exc:
                raise KubevolError(f"cannot read claim {namespace}/{claim} or its volume: "
                                   f"API status {exc.status} {exc.reason}") from None
            except (HTTPError, OSError, ValueError) as exc:
                raise KubevolError(f"cannot read claim {namespace}/{claim}: {exc}") from exc
            pvcs[(namespace, claim)] = _clean(pvc)
            pvs[volume_name] = _clean(pv)
        return Manifests(pvs=pvs, pvcs=pvcs)

    def close(self) -> None:
        """Stop the thread (an open watch is cut). Idempotent."""
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
