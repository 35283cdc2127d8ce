"""Who owns what on a kubelet root: the one model every destructive action asks first.

kubevol may unmount, remove, unstage or detach only what belongs to

* a pod it runs: its pod record under ``<root>/kubevol/pods`` (``up`` writes it, ``down``
  marks it terminating);
* a pod the operator names as gone (``--pod-gone UID``, ``--pods-gone-file``): the operator
  vouches that no agent on the node still runs it;
* with an API server (``--kubeconfig``), a pod the API server listed on this node by that
  UID and does not list as running any more (:class:`PodBindings`): deleted, bound to another
  node, or finished (``Succeeded``/``Failed``). A pod it never listed is not gone because of
  it: a kubelet's static pod lives on disk under its own UID while the API server lists its
  *mirror* pod under another (annotation ``kubernetes.io/config.mirror: <static UID>``, the
  kubelet pairs them by that annotation), and may have no mirror pod yet: a static pod is
  never gone through the API server. A pod being deleted (``deletionTimestamp``) is not gone
  yet: its containers may still run. When the API server cannot be asked, or does not know
  this node, nothing is gone because of it.

Everything else on the root is someone else's: a live kubelet shares the layout, and an
offline tool cannot know which of its pods are gone, so it must not guess. A volume of an
unknown plugin and a device mount under ``plugins/`` of a plugin (or CSI driver) kubevol
does not have are left alone even for a pod it owns: nothing knows how to undo them safely.

Every answer is a :class:`Verdict` saying why, so that a plan can show it and a refusal can
be explained.
"""

from __future__ import annotations

import abc
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from kubevol import layout
from kubevol.layout import CSI_PLUGIN_NAME, validate_path_segment

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

#: Pod phases after which no container runs again.
TERMINAL_PHASES = ("Succeeded", "Failed")


def is_running(pod: Mapping[str, object]) -> bool:
    """Whether the API says the pod may still run containers: not in a terminal phase.
    (Deletion pending does not count: containers stop only after the grace period.)"""
    status = pod.get("status")
    return (status.get("phase") if isinstance(status, Mapping) else None) not in TERMINAL_PHASES


class PodBindings(abc.ABC):
    """What an API server says about the pods of one node."""

    node_name: str

    @abc.abstractmethod
    def gone(self, uid: str) -> bool:
        """Whether pod ``uid`` is known not to run on this node any more: listed by that UID
        before and not listed running now. False whenever the API server cannot say, and for
        a UID it never listed (a static pod's: its mirror pod has a UID of its own)."""


class APIServerBindings(PodBindings):
    """The pods the API server lists on node ``node_name`` (``spec.nodeName`` field
    selector), read through ``api_client`` (a ``kubernetes.client.ApiClient``) on the first
    question and again when the answer is older than ``max_age`` seconds, so that a pod
    bound while a command runs is seen. A pod is gone once a read no longer lists it running
    after an earlier read listed it: for a one-shot command, that is a pod deleted while it
    runs; a pod deleted before is kubevol's to clean up only through its record. Thread-safe.

    A failed list, or a node the API server has no Node object for (the wrong
    ``--node-name`` would make every pod look gone), makes every answer "not gone" and is
    logged once, with the reason kept in :attr:`error`.
    """

    def __init__(self, api_client: ApiClient, node_name: str, *, max_age: float = 2.0) -> None:
        self.api_client = api_client
        self.node_name = node_name
        self.max_age = max_age
        self._lock = threading.Lock()
        self._running: frozenset[str] | None = None
        self._listed: set[str] = set()
        self._read_at = 0.0
        #: Why the API server could not answer (None when it did).
        self.error: str | None = None

    def gone(self, uid: str) -> bool:
        with self._lock:
            if self._running is None or time.monotonic() - self._read_at > self.max_age:
                self._running = self._read()
                self._read_at = time.monotonic()
            return self._running is not None and uid in self._listed \
                and uid not in self._running

    def _read(self) -> frozenset[str] | None:
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        core = CoreV1Api(self.api_client)
        try:
            core.read_node(self.node_name, _preload_content=False, _request_timeout=30)
            resp = core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name}", _preload_content=False,
                _request_timeout=60)
            pods = json.loads(resp.data).get("items") or []
        except ApiException as exc:
            why = (f"node {self.node_name} is not known to the API server"
                   if exc.status == 404 else f"API status {exc.status} {exc.reason}")
            self._failed(why)
            return None
        except (HTTPError, OSError, ValueError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return None
        self.error = None
        uids = {str((p.get("metadata") or {}).get("uid")): p for p in pods}
        self._listed |= set(uids)
        return frozenset(u for u, p in uids.items() if is_running(p))

    def _failed(self, why: str) -> None:
        if self.error != why:
            log.warning("the API server cannot say which pods left node %s (%s): none is "
                        "taken as gone", self.node_name, why)
        self.error = why


@attrs.frozen(kw_only=True)
class Verdict:
    """Whether something may be destroyed, and why (shown in plans and reports)."""

    allowed: bool
    reason: str

    def __bool__(self) -> bool:
        return self.allowed


def _nothing() -> Collection[str]:
    return ()


class Ownership:
    """Answers "may I destroy X, and why" for pods, pod volumes and orphan device mounts.

    ``recorded()`` gives the UIDs of the pods kubevol runs (read on each question: records
    change while an agent runs); ``gone`` the UIDs the operator named as gone;
    ``drivers()`` the CSI drivers kubevol has (registered), whose device mounts it may
    unstage; ``bindings`` what an API server says about this node's pods. ``every_pod``
    makes every pod on the root owned: for an agent that is the only one on its root (as
    the kubelet is on its own), never for a shared root.
    """

    def __init__(
        self,
        *,
        recorded: Callable[[], Collection[str]] = _nothing,
        gone: Iterable[str] = (),
        drivers: Callable[[], Collection[str]] | None = None,
        every_pod: bool = False,
        bindings: PodBindings | None = None,
    ) -> None:
        self._recorded = recorded
        self.bindings = bindings
        self.gone = frozenset(validate_path_segment(u, "pod UID") for u in gone)
        self._drivers = drivers
        self.every_pod = every_pod

    @classmethod
    def sole_agent(cls) -> Ownership:
        """Every pod on the root is the caller's (a node agent alone on its root)."""
        return cls(every_pod=True)

    # -- pods -------------------------------------------------------------------------------

    def pod(self, uid: str) -> Verdict:
        """Whether pod ``uid``'s volumes and directory may be torn down (when not wanted)."""
        if self.every_pod:
            return Verdict(allowed=True, reason="the agent runs every pod on this root")
        if uid in self._recorded():
            return Verdict(allowed=True, reason="kubevol runs it (pod record)")
        if uid in self.gone:
            return Verdict(allowed=True, reason="named gone by the operator")
        if self.bindings is not None:
            if self.bindings.gone(uid):
                return Verdict(allowed=True, reason=(
                    f"the API server listed pod {uid} on node {self.bindings.node_name} and "
                    "lists it running no more (deleted, bound elsewhere or finished)"))
            return Verdict(
                allowed=False,
                reason="not kubevol's: no pod record, not named gone (--pod-gone), and the "
                "API server does not say it left this node (a pod it never listed, such as a "
                "static pod, is never taken as gone)",
            )
        return Verdict(
            allowed=False,
            reason="not kubevol's: no pod record and not named gone (--pod-gone)",
        )

    def __call__(self, uid: str) -> bool:
        """``pod(uid).allowed``: the ``managed`` predicate of the reconciler."""
        return self.pod(uid).allowed

    def foreign_pods(self, uids: Iterable[str]) -> list[str]:
        """Those of ``uids`` that are not kubevol's, sorted."""
        return sorted(u for u in set(uids) if not self.pod(u).allowed)

    # -- volumes and device mounts ----------------------------------------------------------

    def volume(self, uid: str, plugin_name: str, *, plugin_known: bool) -> Verdict:
        """Whether a volume of pod ``uid`` by ``plugin_name`` may be cleaned."""
        pod = self.pod(uid)
        if not pod.allowed:
            return pod
        if not plugin_known:
            return Verdict(
                allowed=False, reason=f"unknown plugin {plugin_name!r}, left alone"
            )
        return pod

    def device_mount(
        self, path: str, plugin_name: str, *, plugins_dir: str, pods_on_disk: Iterable[str]
    ) -> Verdict:
        """Whether a device mount no pod volume leads to may be unmounted.

        It needs a plugin kubevol has (for CSI: a driver it has), and no pod of another
        owner on the root: such a pod may be about to use it (the kubelet stages a device
        before it publishes it to the pod), and nothing on disk says whose it is.
        """
        if not plugin_name:
            return Verdict(allowed=False, reason="unknown plugin, left alone")
        if plugin_name == CSI_PLUGIN_NAME and self._drivers is not None:
            driver = csi_driver_of(path, plugins_dir)
            if driver not in self._drivers():
                return Verdict(
                    allowed=False,
                    reason=f"CSI driver {driver or '?'} is not kubevol's, left alone",
                )
        foreign = self.foreign_pods(pods_on_disk)
        if foreign:
            return Verdict(
                allowed=False,
                reason=(
                    f"{len(foreign)} pod(s) of another owner on this root (e.g. {foreign[0]}) "
                    "may use it, left alone"
                ),
            )
        return Verdict(
            allowed=True,
            reason="no pod volume leads to it and every pod on this root is kubevol's",
        )


def csi_driver_of(path: str, plugins_dir: str) -> str:
    """The driver segment of ``plugins/kubernetes.io/csi/<driver>/...``, or ``""``."""
    rel = layout.relative_to(path, plugins_dir)
    if rel is None:
        return ""
    segs = rel.split("/")
    prefix = layout.plugin_name_segments(CSI_PLUGIN_NAME)
    if segs[: len(prefix)] != prefix or len(segs) <= len(prefix):
        return ""
    return segs[len(prefix)]
