"""What a registered CSI driver tells the cluster about this node, as the kubelet's
``nodeinfomanager`` writes it: the node's ``CSINode`` (``storage.k8s.io/v1``) entry for the
driver (name, node ID, topology keys, ``allocatable.count`` from ``max_volumes_per_node``
when above 0) and the Node's ``csi.volume.kubernetes.io/nodeid`` annotation (a JSON map of
driver name to node ID) with the driver's topology segments as Node labels.

On registration the Node is patched first (a topology label that already has another value
is an error, as upstream), then the CSINode is read — created when missing, owned by the
Node — and updated (an update that meets a newer object is retried on a fresh read). An
entry with the same node ID and topology keys is left as it is. On deregistration the
driver's entry and annotation key go; the CSINode stays, with its other drivers (or none);
an annotation whose map becomes empty is removed. Each step is tried four times with a
10 ms, then 5 times longer each, backoff, as ``updateBackoff``.

A driver deregistered because the registry closes (the agent stopping) keeps its entries:
the kubelet does not unpublish a driver because it restarts.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kubevol.errors import KubevolError
from kubevol.plugins.csi.registration.registry import DriverRegistry, RegisteredDriver
from kubevol.spec import ApiMapping
from kubevol.util.backoff import Backoff

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api, StorageV1Api

log = logging.getLogger(__name__)

#: The Node annotation holding the JSON map of driver name to node ID.
ANNOTATION_NODE_ID = "csi.volume.kubernetes.io/nodeid"
#: The most a CSINode's allocatable count can say (an int32).
MAX_ALLOCATABLE = 2**31 - 1
#: How often each update is tried, and the delays between tries (the kubelet's backoff).
UPDATE_STEPS = 4
UPDATE_BACKOFF = Backoff(initial=0.01, maximum=10.0, factor=5.0)


class NodeInfoError(KubevolError):
    """The Node or CSINode could not be updated (after the retries). ``status``: the HTTP
    status of the API's answer, 0 when there was none."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class _RawResponse(Protocol):
    """What an API call made with ``_preload_content=False`` returns (urllib3's response):
    the body, unread by the client."""

    @property
    def data(self) -> bytes: ...


def _node_id_map(node: ApiMapping) -> dict[str, str]:
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_NODE_ID)
    if not text:
        return {}
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise NodeInfoError(f"failed to parse node's {ANNOTATION_NODE_ID!r} annotation value "
                            f"({text!r}): {exc}") from exc
    if not isinstance(found, dict):
        raise NodeInfoError(f"node's {ANNOTATION_NODE_ID!r} annotation is not a JSON object")
    return {str(k): str(v) for k, v in found.items()}


def _encode(ids: Mapping[str, str]) -> str:
    # As Go's json.Marshal of a map: keys sorted, no spaces.
    return json.dumps(dict(ids), sort_keys=True, separators=(",", ":"))


class NodeInfoManager:
    """Writes the CSINode entries and Node annotation of node ``node_name`` through
    ``api_client`` (a ``kubernetes.client.ApiClient``). Thread-safe enough: every step reads
    the object fresh and retries on a conflict."""

    def __init__(
        self, api_client: ApiClient, node_name: str, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.api_client = api_client
        self.node_name = node_name
        self._sleep = sleep
        self._registry: DriverRegistry | None = None
        #: The last failure per driver (None once it succeeded).
        self.errors: dict[str, str] = {}

    # -- registry wiring --------------------------------------------------------------------

    def follow(self, registry: DriverRegistry) -> None:
        """Publish the drivers registered in ``registry`` now and from now on; unpublish
        those that deregister (not when the registry closes)."""
        self._registry = registry
        registry.add_listener(self._on_change)
        for driver in registry.drivers():
            self._on_change("registered", driver)

    def _on_change(self, event: str, driver: RegisteredDriver) -> None:
        if self._registry is not None and self._registry.closing:
            return
        try:
            if event == "registered":
                info = driver.node_info
                topology = info.accessible_topology.segments if info.accessible_topology else {}
                self.install_driver(driver.name, info.node_id, info.max_volumes_per_node,
                                    topology)
            else:
                self.uninstall_driver(driver.name)
        except NodeInfoError as exc:
            log.error("CSI driver %s %s, but node %s's CSINode/Node could not be updated: %s",
                      driver.name, event, self.node_name, exc)
            self.errors[driver.name] = str(exc)
        else:
            self.errors.pop(driver.name, None)

    # -- the kubelet's InstallCSIDriver / UninstallCSIDriver -----------------------------------

    def install_driver(
        self, name: str, node_id: str, max_volumes: int, topology: Mapping[str, str]
    ) -> None:
        """Record driver ``name`` on the Node and in the CSINode. Raises NodeInfoError."""
        if not node_id:
            raise NodeInfoError("error adding CSI driver node info: driverNodeID must not be "
                                "empty")
        self._retry("updating the Node", lambda: self._patch_node(name, node_id, topology))
        self._retry("updating the CSINode",
                    lambda: self._install_in_csinode(name, node_id, max_volumes, topology))

    def uninstall_driver(self, name: str) -> None:
        """Remove driver ``name`` from the CSINode and the Node. Raises NodeInfoError."""
        self._retry("updating the CSINode", lambda: self._uninstall_from_csinode(name))
        self._retry("updating the Node", lambda: self._patch_node(name, None, {}))

    def _retry(self, what: str, step: Callable[[], None]) -> None:
        errors = []
        for attempt in range(UPDATE_STEPS):
            try:
                step()
                return
            except NodeInfoError as exc:
                errors.append(str(exc))
            if attempt + 1 < UPDATE_STEPS:
                self._sleep(UPDATE_BACKOFF.delay(attempt))
        raise NodeInfoError(f"error {what} of node {self.node_name}: {'; '.join(errors)}")

    # -- API calls (raw dicts: the API's own shapes) -------------------------------------------

    def _call(self, what: str, call: Callable[[], _RawResponse]) -> dict[str, Any]:
        """``call()``'s JSON answer (an API object); NodeInfoError (with its ``status``) for
        an API or transport failure."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            answer: dict[str, Any] = json.loads(call().data)
            return answer
        except ApiException as exc:
            raise NodeInfoError(f"{what}: API status {exc.status} {exc.reason}",
                                exc.status or 0) from None
        except (HTTPError, OSError, ValueError) as exc:
            raise NodeInfoError(f"{what}: {exc}") from exc

    def _core(self) -> CoreV1Api:
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client)

    def _storage(self) -> StorageV1Api:
        from kubernetes.client import StorageV1Api

        return StorageV1Api(self.api_client)

    def _read_node(self) -> ApiMapping:
        return self._call(
            f"get node {self.node_name}",
            lambda: self._core().read_node(self.node_name, _preload_content=False,
                                           _request_timeout=30))

    def _patch_node(self, name: str, node_id: str | None, topology: Mapping[str, str]) -> None:
        """Set (``node_id``) or remove (None) the driver's key of the annotation, and add the
        topology labels; one patch, only when something changes."""
        node = self._read_node()
        ids = _node_id_map(node)
        patch: dict[str, object] = {}
        if node_id is not None and ids.get(name) != node_id:
            ids[name] = node_id
            patch["annotations"] = {ANNOTATION_NODE_ID: _encode(ids)}
        elif node_id is None and name in ids:
            del ids[name]
            patch["annotations"] = {ANNOTATION_NODE_ID: _encode(ids) if ids else None}
        labels = (node.get("metadata") or {}).get("labels") or {}
        for key, value in sorted(topology.items()):
            if key in labels and labels[key] != value:
                raise NodeInfoError(f"detected topology value collision: driver reported "
                                    f"{key!r}:{value!r} but existing label is "
                                    f"{key!r}:{labels[key]!r}")
        if topology and any(labels.get(k) != v for k, v in topology.items()):
            patch["labels"] = dict(topology)
        if not patch:
            return
        self._call(f"patch node {self.node_name}", lambda: self._core().patch_node(
            self.node_name, {"metadata": patch}, _preload_content=False, _request_timeout=30))

    def _read_csinode(self) -> dict[str, Any] | None:
        try:
            result = self._call(
                f"get csinode {self.node_name}",
                lambda: self._storage().read_csi_node(self.node_name, _preload_content=False,
                                                      _request_timeout=30))
        except NodeInfoError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def _create_csinode(self) -> dict[str, Any]:
        node = self._read_node()
        meta = node.get("metadata") or {}
        body = {
            "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": self.node_name, "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": meta.get("name", self.node_name),
                "uid": meta.get("uid", "")}]},
            "spec": {"drivers": []},
        }
        return self._call(
            f"create csinode {self.node_name}",
            lambda: self._storage().create_csi_node(body, _preload_content=False,
                                                    _request_timeout=30))

    def _replace_csinode(self, csinode: ApiMapping) -> None:
        self._call(f"update csinode {self.node_name}", lambda: self._storage().replace_csi_node(
            self.node_name, csinode, _preload_content=False, _request_timeout=30))

    def _install_in_csinode(
        self, name: str, node_id: str, max_volumes: int, topology: Mapping[str, str]
    ) -> None:
        csinode = self._read_csinode() or self._create_csinode()
        drivers = (csinode.get("spec") or {}).get("drivers") or []
        keys = sorted(topology)
        others = [d for d in drivers if d.get("name") != name]
        same = [d for d in drivers if d.get("name") == name]
        if same and same[0].get("nodeID") == node_id \
                and sorted(same[0].get("topologyKeys") or []) == keys:
            return
        entry: dict[str, object] = {"name": name, "nodeID": node_id, "topologyKeys": keys}
        if max_volumes > 0:
            entry["allocatable"] = {"count": min(max_volumes, MAX_ALLOCATABLE)}
        csinode.setdefault("spec", {})["drivers"] = [*others, entry]
        self._replace_csinode(csinode)

    def _uninstall_from_csinode(self, name: str) -> None:
        csinode = self._read_csinode()
        if csinode is None:
            return
        drivers = (csinode.get("spec") or {}).get("drivers") or []
        kept = [d for d in drivers if d.get("name") != name]
        if len(kept) == len(drivers):
            return
        csinode["spec"]["drivers"] = kept
        self._replace_csinode(csinode)
