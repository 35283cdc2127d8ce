"""``Agent``: the long-running node agent behind ``kubevol agent`` (the kubelet's volume
manager loop, with its static-pod source and metrics).

Start-up: the pod records of the root are read and the volumes on disk reconstructed
(everything found is uncertain until an operation confirms it, but what a desired pod's
volumes show finished: a device or pod mount in place, a projected payload; see
:meth:`Agent._adopt`), then the sources are read and the loop converges; it logs
``settled:`` the first time nothing is left to do. A pass looks only at what changed since
the last one (a pod of the sources, a volume whose operation ended, a volume due for its
periodic set-up), every ``period`` seconds while there is work (the kubelet's 100 ms) and
at once when an operation ends that a next step may follow (not a volume's successful
periodic set-up) or a source changes; a pass over every volume runs first and
then every ``RESYNC_PERIOD`` seconds as a safety net. Otherwise the loop sleeps on its
sources, so an idle agent costs next to nothing. Stopping (``stop`` set, e.g.
by SIGTERM) takes no new work, lets running operations finish (for ``STOP_TIMEOUT`` at
most), and never tears a volume down because the agent stops.

Set up again: the kubelet sets every configMap, secret, downwardAPI and projected volume
up again at each pod sync (about once a minute), as it hears of no change to what they
project. Without an API server the agent hears of every change (its manifests): it sets up
again at once the pods a change touches, and otherwise only a projected volume whose
service-account token is due for renewal (the refresh times are kept across restarts:
:mod:`kubevol.node.token_times`). With an API server, every ``remount_period``.

Sources: a static-pod directory (:mod:`kubevol.node.static_pods`) and/or the pods bound to
this node on an API server (:mod:`kubevol.node.api_pods`); both feed one desired state.
Until the API server's pods were listed once, nothing is taken down (the kubelet waits for
its sources to be ready likewise).

Which pods the agent may tear down: those its sources brought (kept in
``<root>/kubevol/agent-pods.json`` across restarts, so a manifest deleted while the agent was
down still takes its pod down) and nothing else. Pods recorded by ``kubevol up`` keep
running as recorded; pods found on disk without a record are left alone.
"""

from __future__ import annotations

import json
import logging
import os
import select
import threading
import time
from typing import Any

import attrs

from kubevol.errors import KubevolError
from kubevol.k8s.events import EventRecorder, KubeEventSink
from kubevol.layout import write_json_atomically
from kubevol.node.api_pods import APIServerPods
from kubevol.node.desired import NewPod, new_pods
from kubevol.node.executor import INITIAL_BACKOFF, OperationKey, OperationKind
from kubevol.node.exporter import AgentMetrics, MetricsServer
from kubevol.node.manager import DEFAULT_REMOUNT_PERIOD
from kubevol.node.manifests import ApiDict, Manifests
from kubevol.node.mountcheck import MountCheck
from kubevol.node.pod_refs import ChangedObjects, PodRefs, PodsByObject
from kubevol.node.podevents import PodVolumeEvents
from kubevol.node.reconstruct import FoundVolume, Reconstruction
from kubevol.node.records import STATE_DIR, PodState, Writer
from kubevol.node.runtime import NodeRuntime
from kubevol.node.sdnotify import SystemdNotifier
from kubevol.node.state import MountState, VolumeMode, VolumeToMount
from kubevol.node.static_pods import ManifestDirectory
from kubevol.node.token_times import TokenRefreshTimes
from kubevol.plugins.atomic_writer import DATA_DIR_NAME
from kubevol.plugins.config_map import CONFIG_MAP_PLUGIN_NAME
from kubevol.plugins.csi.registration.nodeinfo import NodeInfoManager
from kubevol.plugins.csi.registration.watcher import PluginWatcher
from kubevol.plugins.downward_api import DOWNWARD_API_PLUGIN_NAME
from kubevol.plugins.empty_dir import EMPTY_DIR_PLUGIN_NAME
from kubevol.plugins.empty_dir import set_up_finished as empty_dir_set_up_finished
from kubevol.plugins.projected import PROJECTED_PLUGIN_NAME, projects_a_token
from kubevol.plugins.secret import SECRET_PLUGIN_NAME
from kubevol.spec import Spec
from kubevol.util.lifecycle import ClosesOnExit
from kubevol.util.wakeup import WakePipe

log = logging.getLogger(__name__)

#: The kubelet's reconciler loop period (seconds).
LOOP_PERIOD = 0.1
#: The longest an idle agent sleeps between passes (seconds).
IDLE_PERIOD = 1.0
#: The kubelet's --volume-stats-agg-period default (seconds).
VOLUME_STATS_PERIOD = 60.0
#: How often the agent looks at every volume anyway (seconds): the safety net of passes
#: that look only at what changed (volumes due for their periodic set-up are found without).
RESYNC_PERIOD = 60.0
#: How many seconds without a call before an idle agent closes a driver's gRPC channel: an
#: open one keeps gRPC's threads busy (~0.05% of a core); the next call (a pod's, the stats
#: refresh's once a minute) opens it again.
CHANNEL_IDLE_PERIOD = 10.0
#: The source of the agent's Events (what ``kubectl describe`` shows under "From").
EVENT_SOURCE = "kubevol"
#: How long stopping waits for running operations: one stuck below a dead mount (its thread
#: cannot be stopped) is left to end with the process, so SIGTERM stops the agent in seconds.
STOP_TIMEOUT = 10.0
#: How often the thread that wakes the loop on ``stop`` looks whether the loop ended.
STOP_WATCH_PERIOD = 5.0
#: A loop that has not finished a pass for this long is reported unhealthy (seconds).
STALL_AFTER = 60.0
#: The plugins whose volumes project what an agent without an API server reads from its
#: manifests (and a projected volume's tokens).
_FROM_MANIFESTS = frozenset({CONFIG_MAP_PLUGIN_NAME, SECRET_PLUGIN_NAME,
                             DOWNWARD_API_PLUGIN_NAME, PROJECTED_PLUGIN_NAME})


class OwnedPods:
    """The UIDs of the pods the agent's sources brought, in one JSON file under the root."""

    def __init__(self, root_dir: str) -> None:
        self.path = os.path.join(root_dir, STATE_DIR, "agent-pods.json")

    def load(self) -> set[str]:
        """The owned UIDs; empty when none were saved. Raises KubevolError when corrupt."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return set()
        except (OSError, ValueError) as exc:
            raise KubevolError(f"{self.path} is unreadable: {exc}") from exc
        if not isinstance(data, list) or not all(isinstance(u, str) for u in data):
            raise KubevolError(f"{self.path} must hold a JSON list of pod UIDs")
        return set(data)

    def save(self, uids: set[str]) -> None:
        """Replace the owned UIDs (durably)."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        write_json_atomically(self.path, sorted(uids))


class Agent(ClosesOnExit):
    """Runs the pods of its sources on ``runtime``'s root until :meth:`run`'s event is set.

    ``manifest_dir`` is a static-pod directory (None: no such source); ``api_pods`` the pods
    of this node on an API server (None: no such source; started and closed by the agent;
    it also says which pods on the root left the node); ``node_info`` publishes the
    registered CSI drivers in the node's CSINode and nodeid annotation (None: not
    published); CSI drivers register
    through sockets in ``plugins_registry`` (the kubelet's pluginregistration protocol;
    None: only the drivers the runtime was given); ``metrics_address``
    ``HOST:PORT`` serves ``/metrics`` and ``/healthz`` (None: not served); ``max_backoff``
    caps the retry backoff (default: the kubelet's 2 min 2 s); ``remount_period`` is how
    often volumes whose plugin asks for it are looked at for a set-up again (default: the
    kubelet's 1 min; which are set up again: :meth:`_remount_wanted`); an idle agent closes
    a driver's gRPC channel after ``channel_idle_period`` seconds without a call.
    """

    def __init__(
        self,
        runtime: NodeRuntime,
        *,
        manifest_dir: str | None = None,
        api_pods: APIServerPods | None = None,
        node_info: NodeInfoManager | None = None,
        plugins_registry: str | None = None,
        metrics_address: str | None = None,
        period: float = LOOP_PERIOD,
        idle_period: float = IDLE_PERIOD,
        stats_period: float = VOLUME_STATS_PERIOD,
        workers: int = 8,
        max_backoff: float | None = None,
        notifier: SystemdNotifier | None = None,
        remount_period: float = DEFAULT_REMOUNT_PERIOD,
        channel_idle_period: float = CHANNEL_IDLE_PERIOD,
    ) -> None:
        self.runtime = runtime
        self.channel_idle_period = channel_idle_period
        self.remount_period = remount_period
        self.period = period
        self.idle_period = idle_period
        self.stats_period = stats_period
        self.notifier = notifier or SystemdNotifier(None)
        self.owned = OwnedPods(runtime.host.root_dir)
        self._token_times = TokenRefreshTimes(runtime.host.root_dir)
        self._owned = self.owned.load()
        self.source = ManifestDirectory(manifest_dir) if manifest_dir else None
        self.api = api_pods
        self.node_info = node_info
        self.watcher = (
            PluginWatcher.for_registry(plugins_registry, runtime.registry)
            if plugins_registry else None
        )
        backoff: dict[str, Any] = {} if max_backoff is None else {
            "max_backoff": max_backoff, "initial_backoff": min(INITIAL_BACKOFF, max_backoff)
        }
        self.pods = runtime.volume_manager(
            workers=workers, observer=self._observe, bindings=api_pods, **backoff
        )
        self.pods.manager.on_step_end = self._step_ended
        self.metrics = AgentMetrics(self.pods.manager)
        #: Events about pods' volumes, on the API server's pods (None without one).
        self.events = (
            PodVolumeEvents(EventRecorder(KubeEventSink(runtime.kube_client),
                                          component=EVENT_SOURCE, host=runtime.host.node_name),
                            self.pods.manager.desired)
            if runtime.kube_client is not None else None
        )
        self.server = (
            MetricsServer(metrics_address, self.metrics, self.health) if metrics_address else None
        )
        #: The pods last built from the sources, by UID (:meth:`_built_pod`).
        self._built: dict[str, NewPod] = {}
        #: What each pod of the sources refers to, by UID and by the pod object's id, and
        #: the pods that use each object.
        self._refs: dict[str, PodRefs] = {}
        self._refs_by_id: dict[int, PodRefs] = {}
        self._users = PodsByObject()
        #: Whether :meth:`apply_sources` ran once (it then compared every pod with its
        #: record; afterwards only the pods it built anew).
        self._applied = False
        #: The sources' objects as :meth:`apply_sources` last saw them.
        self._last_manifests = Manifests()
        #: Pods of the sources that cannot be run, with why (by UID or file name).
        self.invalid: dict[str, str] = {}
        #: Set once the first reconciler pass finished.
        self.ready = threading.Event()
        #: Set once the loop first had nothing left to do.
        self.settled = threading.Event()
        #: Set when the state may have changed (an operation ended, the sources changed).
        self._changed = threading.Event()
        #: Written to when an operation ends or the API server's pods change: the loop's
        #: wait (a select on it and the manifest directory) wakes at once, so a pod's next
        #: step starts when its last one ended, not at the next tick.
        self._wake = WakePipe()
        if self.api is not None:
            self.api.on_change = self._poke
        self._last_pass = 0.0
        self._last_full = 0.0
        self._last_remount_check = 0.0
        self._last_token_save = 0.0
        self._running = False
        self._started = time.monotonic()

    def running_pods(self) -> list[str]:
        """UIDs of the pods from the agent's sources that it runs now."""
        return sorted(
            uid for uid, r in self.pods.records.items()
            if uid in self._owned and r.state is PodState.RUNNING
        )

    def _observe(
        self, key: OperationKey, kind: OperationKind, seconds: float,
        error: BaseException | None,
    ) -> None:
        # The executor is built before the metrics (they read the manager it belongs to).
        self.metrics.observe(key, kind, seconds, error)
        if self.events is not None:
            self.events.observe(key, kind, error)

    def _step_ended(self) -> None:
        """An operation ended that a next step may follow: a pass at once."""
        self._changed.set()
        self._poke()

    def _poke(self) -> None:
        """Wake the loop's wait (from any thread)."""
        self._wake.poke()

    # -- health -----------------------------------------------------------------------------

    def health(self) -> str | None:
        """None when healthy; else why not (``/healthz`` answers 503 with it)."""
        if not self.ready.is_set():
            return "the first reconcile pass has not finished"
        if not self._running:
            return "the agent is not running"
        stalled = time.monotonic() - self._last_pass
        if stalled > STALL_AFTER:
            return f"no reconcile pass for {stalled:.0f} s"
        return None

    # -- desired pods -------------------------------------------------------------------------

    def apply_sources(self) -> None:
        """Make the records and desired state follow the sources."""
        manifests = self.source.manifests() if self.source is not None else Manifests()
        self.invalid = {f"file {n}": why for n, why in (self.source.errors.items()
                                                         if self.source else [])}
        keep: set[str] = set()
        if self.api is not None:
            manifests = manifests.merged(self.api.manifests())
            self.invalid.update(self.api.errors)
            # A pod whose claims could not be read is still wanted; before the first list
            # nothing is known to be gone.
            keep = self.api.unresolved() if self.api.synced.is_set() else set(self._owned)
        if self.source is not None and not self.source.present:
            keep |= self._owned  # a static pod directory not there yet says nothing is gone
        # The manifests' ConfigMaps, Secrets and CSIDriver objects, readable by the volumes
        # (a record keeps the ConfigMaps and CSIDriver objects its pod uses, never a Secret):
        # those not learnt as they are already (a file not read again keeps its objects).
        last, self._last_manifests = self._last_manifests, manifests
        changed = ChangedObjects(last, manifests)
        self.runtime.learn(attrs.evolve(
            manifests, pods=(), pvs={}, pvcs={},
            config_maps=changed.fresh_config_maps, secrets=changed.fresh_secrets,
            csi_drivers=changed.fresh_csi_drivers,
        ))
        wanted, fresh = self._wanted(manifests, self._users.affected(changed, manifests.pvcs))
        # What no pod of the sources is any more (set operations: a change costs what it
        # changed, not a copy of every pod's entries).
        for uid in self._built.keys() - wanted.keys():
            del self._built[uid]
        for uid in self._refs.keys() - wanted.keys():
            self._forget_refs(self._refs.pop(uid))
        records = self.pods.records
        adding = []
        # Every pod, the first time: a record may be left as a previous run left it.
        for uid in fresh if self._applied else wanted:
            p, r = wanted[uid], records.get(uid)
            if r is None or r.state is not PodState.RUNNING or r.objects != p.record.objects:
                adding.append(p)
        # Only what the agent recorded itself: a UID it once owned may since have been
        # recorded by up (the same static manifest gives the same UID).
        unwanted = self._owned - wanted.keys()
        gone = sorted(uid for uid in unwanted
                      if uid not in keep and uid in records
                      and records[uid].writer is not Writer.UP)
        owned = set(wanted).union(u for u in unwanted
                                  if u in records and records[u].writer is not Writer.UP)
        if owned != self._owned:
            # Saved before the records change: an owned pod always has its UID on disk.
            self.owned.save(owned)
            self._owned = owned
        if adding or gone:
            log.info("static pods: %d to run or update, %d to stop", len(adding), len(gone))
        self.pods.apply(adding=adding, terminating=gone)
        # A record keeps no Secret: the pods projecting one that changed are not built
        # anew, only set up again.
        for uid in self._users.secret_users(changed):
            self.pods.manager.remount_pod(uid)
        self._applied = True
        self._changed.set()

    def _wanted(
        self, manifests: Manifests, affected: set[str]
    ) -> tuple[dict[str, NewPod], list[str]]:
        """The pods of ``manifests`` built for the volume manager, by UID (those whose UIDs
        are in ``affected`` built again), and the UIDs of those built anew: only those can
        differ from their records. A pod that cannot be run is left out and said in
        :attr:`invalid`."""
        wanted: dict[str, NewPod] = {}
        fresh: list[str] = []
        refs_by_id, built_by_uid = self._refs_by_id, self._built
        for pod in manifests.pods:
            # A pod object seen last time whose objects did not change is as it was built
            # (one look up per pod present, no more: this runs on every change).
            refs = refs_by_id.get(id(pod))
            if refs is not None and refs.pod is pod and (uid := refs.uid) not in affected \
                    and uid not in wanted and (built := built_by_uid.get(uid)) is not None:
                wanted[uid] = built
                continue
            try:
                uid = self._pod_uid(pod)
                if uid in wanted:
                    raise KubevolError(f"pod UID {uid} is given twice in the static pods")
                other = self.pods.records.get(uid)
                if other is not None and other.runs_for(Writer.UP) and uid not in self._owned:
                    raise KubevolError(f"pod UID {uid} is run by kubevol up on this root: "
                                       "not taken over")
                wanted[uid] = self._built_pod(uid, attrs.evolve(manifests, pods=(pod,)))
                fresh.append(uid)
            except KubevolError as exc:
                name = (pod.get("metadata") or {}).get("name", "?")
                log.error("static pod %s cannot be run: %s", name, exc)
                self.invalid[f"pod {name}"] = str(exc)
        return wanted, fresh

    def _pod_uid(self, pod: ApiDict) -> str:
        """The pod's UID; what it refers to is kept (:class:`PodRefs`) and indexed."""
        refs = self._refs_by_id.get(id(pod))
        if refs is None or refs.pod is not pod:
            refs = PodRefs.of(pod)
            self._refs_by_id[id(pod)] = refs
        old = self._refs.get(refs.uid)
        if old is not refs:
            if old is not None:
                self._forget_refs(old)  # the pod's previous object
            self._refs[refs.uid] = refs
            self._users.add(refs)
        return refs.uid

    def _forget_refs(self, refs: PodRefs) -> None:
        if self._refs_by_id.get(id(refs.pod)) is refs:
            del self._refs_by_id[id(refs.pod)]
        self._users.remove(refs)

    def _built_pod(self, uid: str, manifests: Manifests) -> NewPod:
        """The pod of ``manifests`` built for the volume manager, as last time when the
        objects it is made of (what its record keeps: pod, claims, volumes, ConfigMaps,
        CSIDriver objects) did not change: a change to one pod's manifest rebuilds that pod,
        not every pod present."""
        (pod,) = manifests.pods
        objects = tuple(manifests.objects_for(pod))
        built = self._built.get(uid)
        if built is None or built.record.objects != objects:
            built = new_pods(self.runtime.mgr, manifests, writer=Writer.AGENT)[0]
            self._built[uid] = built
        return built

    # -- the loop -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Reconstruct, then reconcile until ``stop`` is set; returns after running
        operations finished. Raises KubevolError when a source fails for good."""
        self._running = True
        self._started = time.monotonic()
        stats = threading.Thread(
            target=self._stats_loop, args=(stop,), name="kubevol-volume-stats", daemon=True
        )
        threading.Thread(target=self._poke_on_stop, args=(stop,), name="kubevol-stop-watch",
                         daemon=True).start()
        try:
            if self.server is not None:
                self.server.start()
                log.info("serving metrics on http://%s/metrics", self.server.address)
            if self.node_info is not None:
                self.node_info.follow(self.runtime.registry)
            if self.watcher is not None:
                self.watcher.start()
                log.info("registering CSI drivers from %s", self.watcher.directory)
            if self.api is not None:
                self.api.start()
                log.info("watching the pods of node %s on the API server", self.api.node_name)
            if self.runtime.host.tokens is not None:
                self._token_times.load(self.runtime.host.tokens)
            self._adopt(self.pods.reconstruct())
            self._seed_built()
            self.apply_sources()
            stats.start()
            # ConfigMap, Secret, downwardAPI and projected volumes (service-account tokens
            # among them) are looked at this often, as the kubelet's pod sync does, and set
            # up again when what they project may have changed (_remount_wanted): a token
            # is renewed before it expires, an object read from an API server followed.
            self.pods.manager.reconciler.remount_period = self.remount_period
            self.pods.manager.reconciler.remount_wanted = self._remount_wanted
            self._loop(stop)
        finally:
            self._running = False
            self.notifier.notify("STOPPING=1")
            log.info("stopping: waiting for running operations")
            self.pods.close(STOP_TIMEOUT)
            if self.runtime.host.tokens is not None:
                self._token_times.save_if_changed(self.runtime.host.tokens)
            if self.server is not None:
                self.server.stop()
            if self.watcher is not None:
                self.watcher.stop()
            if self.api is not None:
                self.api.close()
            if self.events is not None:
                self.events.recorder.close()

    def _seed_built(self) -> None:
        """Take the desired pods built from the agent's records (at start-up) as the pods
        last built from the sources: a manifest that did not change while the agent was down
        is not built again (:meth:`_built_pod` compares the objects)."""
        for uid, record in self.pods.records.items():
            pod = self.pods.manager.desired.pod(uid)
            if pod is not None and uid in self._owned and record.runs_for(Writer.AGENT):
                self._built[uid] = NewPod(record=record, desired=pod)

    def _adopt(self, found: Reconstruction) -> None:
        """Take as done what a restart finds finished of its own pods' volumes: a CSI
        device mount (NodeStageVolume's mount point) and a pod's filesystem mount that the
        scan found mounted, of a pod still desired, are marked mounted instead of
        uncertain, so that nothing is staged or published again after a crash or a
        restart (the driver's mount is its answer; every step before it is written before
        the call); so is a plain directory whose set-up shows it finished
        (:meth:`_finished_unmounted`). What else is not found mounted (a missing or
        unresponsive mount, a block volume) stays uncertain and is set up again. What the
        adopted configMap, secret and projected volumes project is brought up to date as
        any change is: a pod whose objects changed while the agent was down (its record
        keeps them) or that projects a Secret (a record keeps none) is set up again by the
        first :meth:`apply_sources`, a token when it is due (:meth:`_remount_wanted`)."""
        desired, actual = self.pods.manager.desired, self.pods.manager.actual
        adopted = 0
        for f in found.volumes:
            if f.dir.mode is not VolumeMode.FILESYSTEM or not desired.is_desired(
                f.unique_name, f.dir.pod_uid
            ):
                continue
            if f.device_mount_path:
                if f.device is not MountCheck.MOUNTED:
                    continue
                actual.set_device_state(f.unique_name, MountState.MOUNTED)
            pod = desired.pod(f.dir.pod_uid)
            volume = next((v for v in pod.volumes if v.unique_name == f.unique_name),
                          None) if pod is not None else None
            if pod is None or volume is None or not self._nothing_after_the_mount(volume):
                continue  # set up again: its later steps are redone
            if f.mount is MountCheck.MOUNTED or (
                f.mount is MountCheck.NOT_MOUNTED and self._finished_unmounted(f, volume)
            ):
                actual.set_pod_state(f.unique_name, f.dir.pod_uid, MountState.MOUNTED,
                                     reconstructed=True)
                adopted += 1
        if adopted:
            log.info("%d volumes found mounted for the pods desired: not set up again", adopted)

    @staticmethod
    def _nothing_after_the_mount(volume: VolumeToMount) -> bool:
        """Whether the pod's set-up of ``volume`` has no step after the mount that a crash
        could have cut short: no fsGroup ownership to apply and no subPath to bind.
        (Such a volume is set up again, as the kubelet sets up every volume it
        reconstructs: the driver's answers are idempotent, the local steps are redone.)"""
        return volume.fs_group is None and not volume.sub_path

    def _finished_unmounted(self, f: FoundVolume, volume: VolumeToMount) -> bool:
        """Whether a volume that is a plain directory shows its set-up finished: a payload
        projected (:meth:`_projected`), or a disk emptyDir's ready marker, written last
        (the desired ``volume``'s spec says which medium: a Memory one needs its tmpfs)."""
        if self._projected(volume.plugin_name, f.spec, f.mount_path):
            return True
        return volume.plugin_name == EMPTY_DIR_PLUGIN_NAME and empty_dir_set_up_finished(
            self.runtime.host, f.dir.pod_uid, f.dir.spec_name, volume.spec)

    def _projected(self, plugin_name: str, spec: Spec, path: str) -> bool:
        """Whether the volume is a plain directory that the atomic writer projected a
        payload into (its ``..data`` link is there) and its plugin sets it up again when
        what it projects changes (configMap, downwardAPI on the node's disk; see
        :meth:`_adopt`)."""
        try:
            plugin = self.runtime.mgr.find_plugin_by_name(plugin_name)
            return (plugin.requires_remount(spec)
                    and os.path.islink(os.path.join(path, DATA_DIR_NAME)))
        except KubevolError:
            return False

    def _remount_wanted(self, volume: VolumeToMount) -> bool:
        """Whether a volume due for its periodic set-up may show something new. The
        kubelet sets every configMap, secret, downwardAPI and projected volume up again on
        each pod sync, as it hears of no change to what they project. The agent does
        without an API server: what they project comes from its manifests, and a change
        there sets the pods it touches up again at once (:meth:`apply_sources`); so only a
        service-account token due for renewal (or of unknown age, after a restart) brings
        a periodic set-up. With an API server (objects read from it), and for the volumes
        of other plugins that ask for it (a CSI driver that requires republishing), every
        time."""
        if self.runtime.kube_client is not None or volume.plugin_name not in _FROM_MANIFESTS:
            return True
        if not projects_a_token(volume.spec):
            return False
        tokens = self.runtime.host.tokens
        return tokens is None or tokens.refresh_due(volume.pod_uid)

    def _loop(self, stop: threading.Event) -> None:
        last_watchdog = 0.0
        busy = True
        # The times are written once quiet, or a resync period after the last write: not
        # in the first step, whose operations may fetch a token while the loop goes on.
        self._last_token_save = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            # A pass only when something may have changed: a source, an operation that
            # ended, work in flight, or the periodic resync. An idle agent wakes only to
            # look at its sources.
            # A pass looks at what changed since the last one (a pod of the sources, a
            # volume whose operation ended): its cost follows the change, not how many pods
            # run. The first pass and the resync look at everything (the safety net, and
            # when volumes due for their periodic set-up are found).
            full = not self.ready.is_set() or now - self._last_full >= RESYNC_PERIOD
            if now - self._last_remount_check >= min(IDLE_PERIOD, self.remount_period):
                self._last_remount_check = now
                if self.pods.manager.reconciler.touch_remounts_due():
                    self._changed.set()
            if busy or full or self._changed.is_set():
                self._changed.clear()
                manager = self.pods.manager
                for failure in manager.executor.failures():
                    if failure.retry_in <= 0:  # its backoff is over: retried by this pass
                        manager.reconciler.touch_key(failure.key)
                started = manager.reconcile(full=full)
                terminating = self._terminating()
                if terminating:
                    self.pods.forget_terminated()
                    terminating = self._terminating()
                self._last_pass = time.monotonic()
                if full:
                    self._last_full = self._last_pass
                busy = bool(started or self.pods.manager.executor.running() or terminating
                            or self.pods.manager.executor.failures())
                if not busy and not self.settled.is_set():
                    self.settled.set()
                    log.info("settled: %d pods desired, %d volumes mounted, nothing left to "
                             "do (%.2f s after start)", len(self.pods.manager.desired.pods()),
                             sum(m.state is MountState.MOUNTED
                                 for m in self.pods.manager.actual.mounted_volumes()),
                             time.monotonic() - self._started)
                if not self.ready.is_set():
                    self.ready.set()
                    self.notifier.notify("READY=1")
                    log.info("first reconcile pass done; %d pods desired",
                             len(self.pods.manager.desired.pods()))
            idle = min(self.idle_period, self.remount_period)
            tokens = self.runtime.host.tokens
            # No pass for an idle period (a busy loop passes every period): nothing happened.
            quiet = now - self._last_pass >= idle
            if tokens is not None and (quiet or now - self._last_token_save >= RESYNC_PERIOD):
                # Once quiet: the write (fsynced, ~10 ms) would hold up the next step of a
                # pod being set up or removed, and a pass that leaves nothing to do may fall
                # between two steps of one. A volume that keeps failing keeps the loop busy:
                # then at the resync period.
                self._token_times.save_if_changed(tokens)
                self._last_token_save = now
            interval = self.notifier.watchdog_interval
            if interval is not None and now - last_watchdog >= interval:
                self.notifier.notify("WATCHDOG=1")
                last_watchdog = now
            if self.runtime.unregistered:
                self.runtime.ensure_drivers()
            if not busy:
                self.runtime.registry.close_idle_channels(self.channel_idle_period)
            if self._wait(stop, self.period if busy else idle):
                self.apply_sources()

    def _terminating(self) -> bool:
        """Whether a pod is terminating, its record not gone yet (a pass may end it)."""
        return bool(self.pods.terminating)

    def _wait(self, stop: threading.Event, timeout: float) -> bool:
        """Wait up to ``timeout`` for a source change, an operation's end or ``stop``;
        whether a source changed."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # ``stop`` pokes the wake pipe (_poke_on_stop): no wake-up just to look at it.
            waiting: list[WakePipe | int] = [self._wake]
            if self.source is not None and self.source.present:
                waiting.append(self.source.fileno())
            ready, _, _ = select.select(waiting, [], [], left)
            woken = self._wake in ready
            if woken:
                self._wake.drain()
            changed = False
            if self.source is not None and (not self.source.present or len(ready) > woken):
                changed = self.source.wait(0)
            if self.api is not None and self.api.wait(0):
                changed = True
            if changed:
                return True
            if woken:
                return False
        return False

    def _poke_on_stop(self, stop: threading.Event) -> None:
        """Wake the loop's wait once ``stop`` is set, so that the wait needs no timeout to
        notice it: on this kind of machine each wake-up of a sleeping thread costs ~0.1 ms
        of CPU, which ten a second made a third of an idle agent's CPU. Ends with the
        loop."""
        while not stop.wait(STOP_WATCH_PERIOD):
            if not self._running:
                return
        self._poke()

    def _stats_loop(self, stop: threading.Event) -> None:
        # Measured once the loop settled first (or a period passed, whichever comes first):
        # a restart does not measure every claim while it rebuilds its state.
        deadline = time.monotonic() + self.stats_period
        while not self.settled.is_set() and time.monotonic() < deadline:
            if stop.wait(LOOP_PERIOD):
                return
        while not stop.is_set():
            try:
                self.metrics.stats.refresh()
            except Exception:  # measuring must never stop the agent
                log.exception("volume stats refresh failed")
            stop.wait(self.stats_period)

    def close(self) -> None:
        """Stop watching the sources. Idempotent (``run`` already closed the rest)."""
        if self.source is not None:
            self.source.close()
        if self.api is not None:
            self.api.close()
        self._wake.close()
