"""What a running agent tells Prometheus and health checkers, under the kubelet's names.

- ``kubelet_volume_stats_{capacity,available,used}_bytes`` and
  ``kubelet_volume_stats_inodes{,_free,_used}`` with ``namespace`` and
  ``persistentvolumeclaim`` labels, one series per claim a running pod mounted or mapped
  (a claim shared by several pods once, as the kubelet's ``volume_stats.go`` collector
  does; block claims through their mapper's NodeGetVolumeStats, kubernetes#97972), and
  ``kubelet_volume_stats_health_status_abnormal``. As in the kubelet, they come from a
  cache that :class:`VolumeStats` refreshes on a period (``--volume-stats-agg-period``), so a
  scrape never walks a volume.
- ``storage_operation_duration_seconds`` (labels ``volume_plugin``, ``operation_name``,
  ``status``, ``migrated``), observed as each operation ends.
- kubevol's own reconciler gauges (``kubevol_reconciler_*``).

Everything lives in one :class:`prometheus_client.CollectorRegistry` per agent: no
process-wide metric objects.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from http.server import HTTPServer

import attrs
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kubevol.errors import KubevolError, MetricsError
from kubevol.k8s.pod import Pod
from kubevol.layout import CSI_PLUGIN_NAME
from kubevol.manager import VolumePluginMgr
from kubevol.mount.probe import Pending, UnresponsiveError
from kubevol.node.executor import OperationKey, OperationKind
from kubevol.node.httpbounds import DEFAULT_LIMITS, BoundedHandler, BoundedServer, ConnectionLimits
from kubevol.node.manager import NodeVolumeManager
from kubevol.node.manifests import namespace_of
from kubevol.node.state import MountState, VolumeMode
from kubevol.spec import DeferredApiObject
from kubevol.util.lifecycle import RunsWhileEntered
from kubevol.volume import Metrics, MetricsProvider

log = logging.getLogger(__name__)

#: The kubelet's ``operation_name`` for each kind of operation. kubevol splits the
#: kubelet's MountVolume into a device mount and a set-up; the device mount gets its own name.
OPERATION_NAMES: Mapping[OperationKind, str] = {
    OperationKind.ATTACH: "volume_attach",
    OperationKind.WAIT_FOR_ATTACH: "verify_controller_attached_volume",
    OperationKind.MOUNT_DEVICE: "mount_device",
    OperationKind.SET_UP: "volume_mount",
    OperationKind.TEAR_DOWN: "volume_unmount",
    OperationKind.UNMOUNT_DEVICE: "unmount_device",
    OperationKind.DETACH: "volume_detach",
    OperationKind.MAP: "map_volume",
    OperationKind.UNMAP: "unmap_volume",
    OperationKind.UNMAP_DEVICE: "unmap_device",
    OperationKind.EXPAND: "volume_fs_resize",
}

#: The kubelet's buckets for storage_operation_duration_seconds.
OPERATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600)

@attrs.frozen(kw_only=True)
class ClaimStats:
    """One claim's usage at one measurement (bytes and inodes; None = not reported)."""

    namespace: str
    claim: str
    capacity: int | None
    available: int | None
    used: int | None
    inodes: int | None
    inodes_free: int | None
    inodes_used: int | None
    abnormal: bool | None


def _claims_of(pod: Pod | None) -> dict[str, tuple[str, str]]:
    """``(namespace, claim)`` of each of the pod's volumes that is a claim, by name (the
    first volume of a name that is a claim)."""
    if pod is None:
        return {}
    namespace, volumes = _namespace_and_claim_volumes(pod)
    claims: dict[str, tuple[str, str]] = {}
    for name, claim_name in volumes:
        if isinstance(name, str) and name not in claims:
            claims[name] = (namespace, claim_name)
    return claims


def _namespace_and_claim_volumes(pod: Pod) -> tuple[str, list[tuple[object, str]]]:
    """The pod's namespace (``default`` when unset) and ``(volume name, claim name)`` of its
    claim volumes. A deferred pod (an agent's record) is read from its dict: a stats refresh
    after a restart then builds no pod model, which costs the pod classes' import and a
    validation each."""
    if isinstance(pod, DeferredApiObject):
        volumes = [
            (volume.get("name"), source.get("claimName"))
            for volume in (pod.data.get("spec") or {}).get("volumes") or []
            if (source := volume.get("persistentVolumeClaim")) is not None
        ]
        return namespace_of(pod.data), volumes
    if not pod.spec:
        return "default", []
    volumes = [
        (getattr(volume, "name", None), source.claim_name)
        for volume in pod.spec.volumes or []  # V1Volume: read by name
        if (source := getattr(volume, "persistent_volume_claim", None)) is not None
    ]
    return (pod.metadata.namespace if pod.metadata is not None else None) or "default", volumes


#: A pod volume as the stats refresh knows it: unique name, plugin, spec name, pod UID,
#: whether it is a block volume.
_ProviderKey = tuple[str, str, str, str, bool]


class VolumeStats:
    """The usage of every claim mounted for a desired pod, measured by :meth:`refresh`
    through the volume's plugin (as ``kubevol status`` measures it), kept until the next."""

    def __init__(self, manager: NodeVolumeManager) -> None:
        self.manager = manager
        self._lock = threading.Lock()
        self._stats: tuple[ClaimStats, ...] = ()
        #: When the last refresh ended (monotonic), or None before the first.
        self.refreshed: float | None = None
        #: What measured each pod volume at the last refresh (its unmounter, built from the
        #: files its set-up wrote), kept while the same volume stays mounted for the pod.
        self._providers: dict[_ProviderKey, tuple[str, MetricsProvider] | None] = {}

    def refresh(self) -> None:
        """Measure every mounted claim now (slow: may walk volumes or call drivers).

        A claim several pods use is measured once, through the first of them that gives
        figures (the kubelet's collector keeps the first pod's and skips the claim after).
        CSI volumes are all asked at once, under one deadline of the host's probe: a
        driver that does not answer costs one deadline, not one per claim."""
        # One look at the actual state for the whole refresh, not one per claim.
        mounted = {(m.unique_name, m.pod_uid) for m in self.manager.actual.mounted_volumes()
                   if m.state is MountState.MOUNTED}
        providers, self._providers = self._providers, {}
        # Each claim's pod volumes, in the pods' order (the position gives the order of
        # the figures, as when they were measured one after the other).
        candidates: dict[tuple[str, str], list[tuple[int, _ProviderKey]]] = {}
        position = 0
        for pod in self.manager.desired.pods():
            claims = _claims_of(pod.pod)
            if not claims:
                continue
            for volume in pod.volumes:
                claim = claims.get(volume.outer_name)
                if claim is None or (volume.unique_name, pod.uid) not in mounted:
                    continue
                key = (volume.unique_name, volume.plugin_name, volume.spec.name(), pod.uid,
                       volume.mode is VolumeMode.BLOCK)
                if key in providers:
                    self._providers[key] = providers[key]
                candidates.setdefault(claim, []).append((position, key))
                position += 1
        # The first pod volume of each claim; the next one of a claim without figures.
        found: list[tuple[int, ClaimStats]] = []
        turn = list(candidates.items())
        while turn:
            stats = self._measure_each([(claim, keys[0][1]) for claim, keys in turn])
            left = []
            for (claim, keys), one in zip(turn, stats, strict=True):
                if one is not None:
                    found.append((keys[0][0], one))
                elif len(keys) > 1:
                    left.append((claim, keys[1:]))
            turn = left
        found.sort(key=lambda f: f[0])
        with self._lock:
            self._stats = tuple(one for _, one in found)
            self.refreshed = time.monotonic()

    def _provider(
        self, plugin_name: str, spec_name: str, pod_uid: str, *, block: bool
    ) -> tuple[str, MetricsProvider] | None:
        """What measures the pod's volume and the path it measures at: the unmounter for a
        filesystem volume; for a block volume the unmapper when it reports metrics (the
        kubelet's ``ListBlockVolumesForPod`` keeps the mappers that are MetricsProviders),
        None otherwise."""
        if not block:
            unmounter = self.manager.mgr.find_plugin_by_name(plugin_name).new_unmounter(
                spec_name, pod_uid
            )
            return unmounter.get_path(), unmounter
        plugin = self.manager.mgr.find_mapper_plugin_by_name(plugin_name)
        if plugin is None:
            return None
        unmapper = plugin.new_block_volume_unmapper(spec_name, pod_uid)
        if not isinstance(unmapper, MetricsProvider):
            return None
        map_dir, link = unmapper.get_pod_device_map_path()
        return os.path.join(map_dir, link), unmapper

    def _measurer(self, key: _ProviderKey) -> tuple[str, MetricsProvider] | None:
        """The pod volume's path measured and provider, kept from the last refresh or
        built now."""
        if key in self._providers:
            return self._providers[key]
        _, plugin_name, spec_name, pod_uid, block = key
        found = self._providers[key] = self._provider(plugin_name, spec_name, pod_uid,
                                                      block=block)
        return found

    def _measure_each(
        self, volumes: list[tuple[tuple[str, str], _ProviderKey]]
    ) -> list[ClaimStats | None]:
        """Each claim's figures through the pod volume given, or None when it gives none.

        Measuring walks below the mount point (or opens a device, or asks a driver that
        does): through the host's probe, so a dead server costs its claims only. While one
        measurement of a volume is stuck, it is not tried again, and the claim is reported
        abnormal, as the kubelet reports an abnormal CSI volume condition. What can be
        started without waiting (a CSI driver's NodeGetVolumeStats) is, all at once, and
        waited for together: no thread hand-off per claim."""
        probe = self.manager.host.probe
        out: list[ClaimStats | None] = [None] * len(volumes)
        sent: list[tuple[int, str, Callable[[], Pending[Metrics]]]] = []
        for i, (claim, key) in enumerate(volumes):
            try:
                found = self._measurer(key)
                if found is None:
                    continue
                path, provider = found
                start = provider.metrics_starter()
                if start is not None:
                    sent.append((i, path, start))
                    continue
                got: Metrics | BaseException = probe.call(
                    path, path, "measuring usage", provider.get_metrics)
            except BaseException as exc:  # judged below, as the others' are
                got = exc
            out[i] = _claim_stats(claim, got)
        if sent:
            answers = probe.wait_each(
                [(path, path, "measuring usage", start) for _, path, start in sent])
            for (i, _, _), got in zip(sent, answers, strict=True):
                out[i] = _claim_stats(volumes[i][0], got)
        return out

    def snapshot(self) -> tuple[ClaimStats, ...]:
        """The last measurement."""
        with self._lock:
            return self._stats


def _claim_stats(claim: tuple[str, str], got: Metrics | BaseException) -> ClaimStats | None:
    """The claim's figures from a measurement, or None when it gave none (the reason is
    logged); what is no measurement's failure is raised."""
    if isinstance(got, UnresponsiveError):
        log.warning("claim %s/%s: %s", *claim, got)
        return ClaimStats(namespace=claim[0], claim=claim[1], capacity=None, available=None,
                          used=None, inodes=None, inodes_free=None, inodes_used=None,
                          abnormal=True)
    if isinstance(got, KubevolError | MetricsError | OSError | ValueError):
        log.debug("no usage for claim %s/%s: %s", *claim, got)
        return None
    if isinstance(got, BaseException):
        raise got
    return ClaimStats(
        namespace=claim[0], claim=claim[1], capacity=got.capacity, available=got.available,
        used=got.used, inodes=got.inodes, inodes_free=got.inodes_free,
        inodes_used=got.inodes_used, abnormal=got.abnormal,
    )


_STATS_GAUGES = (
    ("kubelet_volume_stats_capacity_bytes", "Capacity in bytes of the volume", "capacity"),
    ("kubelet_volume_stats_available_bytes", "Number of available bytes in the volume",
     "available"),
    ("kubelet_volume_stats_used_bytes", "Number of used bytes in the volume", "used"),
    ("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", "inodes"),
    ("kubelet_volume_stats_inodes_free", "Number of free inodes in the volume", "inodes_free"),
    ("kubelet_volume_stats_inodes_used", "Number of used inodes in the volume", "inodes_used"),
)
_CLAIM_LABELS = ["namespace", "persistentvolumeclaim"]


class _AgentCollector(Collector):
    """Volume stats from the cache and reconciler gauges, read at scrape time."""

    def __init__(self, stats: VolumeStats, manager: NodeVolumeManager) -> None:
        self.stats = stats
        self.manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self.stats.snapshot()
        for name, help_text, field in _STATS_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=_CLAIM_LABELS)
            for s in snapshot:
                value = getattr(s, field)
                if value is not None:
                    family.add_metric([s.namespace, s.claim], float(value))
            yield family
        health = GaugeMetricFamily(
            "kubelet_volume_stats_health_status_abnormal",
            "Abnormal volume health status: 1 abnormal, 0 normal", labels=_CLAIM_LABELS,
        )
        for s in snapshot:
            if s.abnormal is not None:
                health.add_metric([s.namespace, s.claim], 1.0 if s.abnormal else 0.0)
        yield health
        yield from self._reconciler()

    def _reconciler(self) -> Iterator[GaugeMetricFamily]:
        desired = sum(len(p.volumes) for p in self.manager.desired.pods())
        mounted = self.manager.actual.mounted_volumes()
        uncertain = sum(1 for m in mounted if m.state is MountState.UNCERTAIN)
        executor = self.manager.executor
        failing = executor.failures()
        for name, help_text, value in (
            ("kubevol_reconciler_desired_volumes", "Pod volumes desired", desired),
            ("kubevol_reconciler_actual_volumes", "Pod volumes in the actual state",
             len(mounted)),
            ("kubevol_reconciler_uncertain_volumes", "Pod volumes whose mount is uncertain",
             uncertain),
            ("kubevol_reconciler_pending_operations", "Operations running",
             len(executor.pending())),
            ("kubevol_reconciler_backoff_operations", "Operations waiting out a backoff",
             sum(1 for f in failing if f.retry_in > 0)),
        ):
            yield GaugeMetricFamily(name, help_text, value=float(value))


class AgentMetrics:
    """The agent's registry: volume stats, operation durations, reconciler gauges."""

    def __init__(self, manager: NodeVolumeManager) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stats = VolumeStats(manager)
        self.mgr: VolumePluginMgr = manager.mgr
        self.operations = Histogram(
            "storage_operation_duration_seconds", "Storage operation duration",
            ["volume_plugin", "operation_name", "status", "migrated"],
            buckets=OPERATION_BUCKETS, registry=self.registry,
        )
        self.registry.register(_AgentCollector(self.stats, manager))

    def plugin_label(self, unique_volume_name: str) -> str:
        """The kubelet's ``volume_plugin`` label: the plugin's name, and for CSI volumes
        ``kubernetes.io/csi:<driver>``."""
        parts = unique_volume_name.split("/")
        name = "/".join(parts[:2])
        try:
            self.mgr.find_plugin_by_name(name)
        except KubevolError:
            name = parts[0]  # a plugin name without a domain part
        if name == CSI_PLUGIN_NAME and len(parts) > 2:
            return f"{CSI_PLUGIN_NAME}:{parts[2].split('^', 1)[0]}"
        return name

    def observe(
        self, key: OperationKey, kind: OperationKind, seconds: float,
        error: BaseException | None,
    ) -> None:
        """Record one finished operation (an executor observer); kubevol's own kinds
        (a pod directory's removal) are no kubelet storage operation and are left out."""
        if kind not in OPERATION_NAMES:
            return
        self.operations.labels(
            volume_plugin=self.plugin_label(key.volume),
            operation_name=OPERATION_NAMES[kind],
            status="success" if error is None else "fail-unknown",
            migrated="false",
        ).observe(seconds)

    def exposition(self) -> bytes:
        """The text a scrape of ``/metrics`` returns."""
        return generate_latest(self.registry)


class _HTTPServer(BoundedServer, HTTPServer):
    name = "metrics server"


class MetricsServer(RunsWhileEntered):
    """``/metrics`` and ``/healthz`` over HTTP on ``address`` (``HOST:PORT``; port 0 picks
    one). ``healthy()`` decides ``/healthz``: 200 ``ok`` or 503 with the reason. Slow,
    idle and surplus connections are cut within ``limits`` (:mod:`kubevol.node.httpbounds`)."""

    def __init__(
        self, address: str, metrics: AgentMetrics, healthy: Callable[[], str | None], *,
        limits: ConnectionLimits = DEFAULT_LIMITS,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise KubevolError(f"--metrics-address: expected HOST:PORT, got {address!r}")
        self._bind = (host.strip("[]") or "127.0.0.1", int(port))
        self.metrics = metrics
        self.healthy = healthy
        self.limits = limits
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` actually bound."""
        assert self._server is not None, "the server is not started"
        host, port = self._server.server_address[:2]
        return f"{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> MetricsServer:
        outer = self

        class Handler(BoundedHandler):
            def log_message(self, format: str, *args: object) -> None:
                log.debug("metrics server: " + format, *args)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(HTTPStatus.OK, outer.metrics.exposition(), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    problem = outer.healthy()
                    if problem is None:
                        self._answer(HTTPStatus.OK, b"ok", "text/plain")
                    else:
                        self._answer(HTTPStatus.SERVICE_UNAVAILABLE, problem.encode(),
                                     "text/plain")
                else:
                    self._answer(HTTPStatus.NOT_FOUND, b"not found", "text/plain")

            def _answer(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        try:
            self._server = _HTTPServer(self._bind, Handler, limits=self.limits)
        except OSError as exc:
            raise KubevolError(
                f"cannot serve metrics on {self._bind[0]}:{self._bind[1]}: {exc.strerror}"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kubevol-metrics", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
