"""``NodeRuntime``: everything a node agent needs on one kubelet-style root, assembled.

It builds the host, the plugin manager with the built-in plugins and the
``kubernetes.io/csi`` plugin, and the CSI driver registry; it remembers the CSI drivers it
was given (``<root>/kubevol/csi-drivers.json``, name → endpoint) so that later runs on the
same root reach them again, and registers them, retrying those that were down::

    drivers = {"hostpath.csi.kubevol.io": "unix:///run/hp.sock"}
    with open_node("/var/lib/kubevol", csi_drivers=drivers) as node:
        pods = node.volume_manager()

This module imports the CSI stack (gRPC); the rest of :mod:`kubevol.node` does not.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

import attrs

from kubevol.csi.client import CSIClient
from kubevol.csi.endpoint import parse_endpoint
from kubevol.csi.errors import CSIEndpointError
from kubevol.errors import KubevolError, PluginValidationError
from kubevol.k8s.objects import APIObjectSource, ChainedObjects, KubeAPIObjects, ManifestObjects
from kubevol.k8s.tokens import TokenManager
from kubevol.layout import write_json_atomically
from kubevol.manager import VolumePluginMgr, entry_point_plugins
from kubevol.mount.guard import GuardPolicy
from kubevol.node.desired import NewPod, desired_pod
from kubevol.node.host import NodeVolumeHost, node_plugins
from kubevol.node.manager import NodeVolumeManager, SyncResult
from kubevol.node.manifests import Manifests
from kubevol.node.owners import APIServerBindings, Ownership, PodBindings
from kubevol.node.reconstruct import Reconstruction
from kubevol.node.records import STATE_DIR, PodRecord, PodRecords, PodState, RecordWatcher
from kubevol.node.rootlock import RootLock
from kubevol.plugins.csi import CSIPlugin
from kubevol.plugins.csi.driverinfo import KubernetesCSIDrivers, LocalCSIDrivers
from kubevol.plugins.csi.registration import DriverRegistry
from kubevol.util.deadline import Deadline
from kubevol.util.lifecycle import ClosesOnExit
from kubevol.util.safeio import load_json_file
from kubevol.util.turns import given_up

log = logging.getLogger(__name__)

#: The CSI versions assumed for a driver given by endpoint (it has no registration socket
#: to say which it speaks): every CSI driver in use speaks 1.x.
ASSUMED_CSI_VERSIONS = ("1.0.0",)

#: How long registration waits for a driver's NodeGetInfo.
REGISTRATION_TIMEOUT = 5.0

#: How often a long-running agent retries drivers that could not be registered.
REGISTRATION_RETRY = 1.0


#: The CSI drivers remembered on a root, in kubevol's own directory under it.
DRIVERS_FILE = "csi-drivers.json"


class DriverEndpoints:
    """The CSI drivers known on a root (name → endpoint), in one JSON file written atomically."""

    def __init__(self, root_dir: str) -> None:
        self.path = os.path.join(root_dir, STATE_DIR, DRIVERS_FILE)

    def load(self) -> dict[str, str]:
        """The known drivers; ``{}`` when none. Raises KubevolError for a corrupt file."""
        try:
            data = load_json_file(self.path)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise KubevolError(f"{self.path} is unreadable: {exc}") from exc
        if not isinstance(data, dict):
            raise KubevolError(f"{self.path} must hold a JSON object of name: endpoint")
        return {str(k): str(v) for k, v in data.items()}

    def forget(self, name: str) -> str:
        """Remove driver ``name``; its endpoint. Raises KubevolError when it is not known."""
        known = self.load()
        if name not in known:
            raise KubevolError(
                f"CSI driver {name!r} is not remembered under this root "
                f"(known: {', '.join(sorted(known)) or 'none'})")
        endpoint = known.pop(name)
        self.save(known)
        return endpoint

    def save(self, drivers: Mapping[str, str]) -> None:
        """Replace the known drivers."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        write_json_atomically(self.path, dict(drivers))


def check_driver_endpoint(name: str, endpoint: str) -> None:
    """Raise KubevolError when ``endpoint`` (of driver ``name``) is not a CSI endpoint
    (``unix:///abs/path.sock`` or ``tcp://HOST:PORT``)."""
    try:
        parse_endpoint(endpoint)
    except CSIEndpointError as exc:
        raise KubevolError(f"--csi-driver {name}={endpoint}: {exc}") from exc


def parse_driver_flag(value: str) -> tuple[str, str]:
    """``NAME=ENDPOINT`` → (name, endpoint); a bare socket path becomes ``unix://PATH``.

    Raises ValueError naming the value when it is not of that form.
    """
    name, sep, endpoint = value.partition("=")
    if not sep or not name or not endpoint:
        raise ValueError(f"expected NAME=ENDPOINT (e.g. hostpath.csi.kubevol.io=unix:///run/"
                         f"hp.sock), got {value!r}")
    if endpoint.startswith("/"):
        endpoint = "unix://" + endpoint
    return name, endpoint


class NodeRuntime(ClosesOnExit):
    """Host, plugins, CSI registry and records of one root. Close it when done."""

    def __init__(
        self,
        root_dir: str,
        *,
        node_name: str | None = None,
        csi_drivers: Mapping[str, str] | None = None,
        guard_policy: GuardPolicy | str = GuardPolicy.SAFE,
        csi_timeout: float = 60.0,
        registration_timeout: float = REGISTRATION_TIMEOUT,
        kube_client: Any = None,
        tokens: TokenManager | None = None,
        node_labels: Mapping[str, str] | None = None,
        entry_points: bool | Sequence[str] = True,
        deadline: Deadline | None = None,
        lock: RootLock | None = None,
        drivers_must_answer: bool = False,
    ) -> None:
        #: The command's deadline (see :mod:`kubevol.util.deadline`): every CSI call and
        #: registration probe gets at most what is left of it.
        self.deadline = deadline or Deadline.never()
        self.registration_timeout = registration_timeout
        #: Held (taken here, before anything is read or written) until :meth:`close`.
        self.lock = lock
        if lock is not None and not lock.held:
            lock.acquire()
        try:
            #: ConfigMaps and Secrets of the manifests given (:meth:`learn`) and of the records;
            #: then the API server's, when ``kube_client`` is given.
            self.objects = ManifestObjects()
            #: CSIDriver objects of the manifests and records (:meth:`learn`): what says how
            #: to treat a driver on a node without an API server.
            self.local_csi_drivers = LocalCSIDrivers()
            self.kube_client = kube_client
            source: APIObjectSource = self.objects
            if kube_client is not None:
                source = ChainedObjects([self.objects, KubeAPIObjects(kube_client)])
            self.host = NodeVolumeHost(
                root_dir=root_dir, node_name=node_name or socket.gethostname().split(".")[0],
                kube_client=kube_client, objects=source, tokens=tokens,
                # With an API server its CSIDriver objects say how to treat a driver
                # (attachRequired, podInfoOnMount, fsGroupPolicy), as the kubelet reads them;
                # without one, the CSIDriver objects of the manifests and records do.
                csi_drivers=(KubernetesCSIDrivers(kube_client) if kube_client is not None
                             else self.local_csi_drivers),
                node_labels=dict(node_labels or {}),
            )
            #: What the API server says about this node's pods (``kube_client`` given): pods
            #: it no longer lists here are gone (issue 14's third owner).
            self.bindings: PodBindings | None = (
                APIServerBindings(kube_client, self.host.node_name)
                if kube_client is not None else None
            )
            self.registry = DriverRegistry(
                node_info_timeout=self.registration_timeout,
                # While a driver works, the node's other operations take their turns.
                client_factory=lambda endpoint: CSIClient(
                    endpoint, timeout=csi_timeout, around_call=given_up
                ),
            )
            self.csi = CSIPlugin(
                registry=self.registry, guard_policy=guard_policy, timeout=csi_timeout,
                attach_timeout=csi_timeout, deadline=self.deadline,
            )
            self.mgr = VolumePluginMgr()
            self.mgr.init_plugins(node_plugins(csi=self.csi), host=self.host)
            #: Why third-party plugins were not loaded (the built-in ones always are).
            self.plugin_problems = self._add_entry_point_plugins(entry_points)
            self.records = PodRecords(self.host)
            self.endpoints = DriverEndpoints(self.host.root_dir)
            self._wanted: dict[str, str] = {}
            self._last_try = 0.0
            self._lock = threading.Lock()
            #: Drivers that could not be registered, with why (retried by ensure_drivers).
            self.unregistered: dict[str, str] = {}
            known = self.endpoints.load()
            given = dict(csi_drivers or {})
            for name, endpoint in given.items():
                check_driver_endpoint(name, endpoint)
            #: Drivers given that are not remembered yet: remembered once they answer.
            self._unsaved = {n: e for n, e in given.items() if known.get(n) != e}
            self._wanted = {**known, **given}
            # A one-shot command's driver that does not answer is its error, said once.
            missing = self.ensure_drivers(
                force=True, quiet=set(self._unsaved) if drivers_must_answer else set())
            refused = {n: why for n, why in missing.items() if n in self._unsaved}
            if refused and drivers_must_answer:
                name, why = sorted(refused.items())[0]
                raise KubevolError(
                    f"--csi-driver {name}={given[name]}: the driver does not answer, so it is "
                    f"not remembered ({why}); start the driver or correct the endpoint, and "
                    "give --csi-driver again")
        except BaseException:
            self.close()
            raise

    def _add_entry_point_plugins(self, wanted: bool | Sequence[str]) -> list[str]:
        """Register the plugins of the ``kubevol.plugins`` entry points: all of them
        (True), none (False), or only those whose plugin names are listed. A broken or
        clashing third-party plugin is reported, never fatal."""
        if wanted is False:
            return []
        found, problems = entry_point_plugins()
        if wanted is not True:
            names = set(wanted)
            found = [p for p in found if p.get_plugin_name() in names]
            missing = names - {p.get_plugin_name() for p in found}
            problems += [f"no installed plugin is named {n!r}" for n in sorted(missing)]
        try:
            self.mgr.init_plugins(found, host=self.host)
        except PluginValidationError as exc:
            problems += list(exc.problems)
        return problems

    def ensure_drivers(
        self, *, force: bool = False, quiet: Set[str] = frozenset()
    ) -> dict[str, str]:
        """Register the known drivers that are not registered yet (at most once per
        :data:`REGISTRATION_RETRY` seconds unless ``force``); returns those still missing,
        each logged as a warning unless named in ``quiet``."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_try < REGISTRATION_RETRY:
                return dict(self.unregistered)
            self._last_try = now
            missing = {n: e for n, e in self._wanted.items() if not self.registry.is_registered(n)}
            self.registry.node_info_timeout = self.deadline.cap(self.registration_timeout)
        problems: dict[str, str] = {}
        for name, endpoint in sorted(missing.items()):
            try:
                self.registry.register_driver(name, endpoint, ASSUMED_CSI_VERSIONS)
            except KubevolError as exc:
                if name not in quiet:
                    log.warning("CSI driver %s at %s is not available: %s", name, endpoint, exc)
                problems[name] = f"{endpoint}: {exc}"
        with self._lock:
            self.unregistered = problems
            answered = {n: e for n, e in self._unsaved.items() if n not in problems}
            for name in answered:
                del self._unsaved[name]
        if answered:
            # Only a driver that answered is remembered: a typo in an endpoint never
            # reaches the root's list (nor warns on every later command).
            self.endpoints.save({**self.endpoints.load(), **answered})
        return dict(problems)

    def learn(self, manifests: Manifests) -> None:
        """Make the ConfigMaps and Secrets of ``manifests`` readable by the volumes, and
        their CSIDriver objects the drivers' description (without an API server: with one,
        its own objects are the truth, as for the kubelet, and these are left out)."""
        for obj in manifests.api_objects():
            self.objects.add(obj)
        if manifests.csi_drivers and self.kube_client is not None:
            log.warning("CSIDriver objects of the manifests (%s) are ignored: the API "
                        "server's are used", ", ".join(sorted(manifests.csi_drivers)))
            return
        for obj in manifests.csi_drivers.values():
            self.local_csi_drivers.add(obj)

    def volume_manager(
        self, *, adding: Sequence[NewPod] = (), terminating: Sequence[PodRecord] = (),
        **kwargs: Any,
    ) -> RecordedPods:
        """A volume manager on this root that runs the recorded pods and, recorded first,
        ``adding`` and tears down ``terminating`` (see :class:`RecordedPods`); other keyword
        arguments go to :class:`NodeVolumeManager`."""
        return RecordedPods(self, adding=adding, terminating=terminating, **kwargs)

    def hold(self, lock: RootLock) -> None:
        """Take the root's lock now (waiting as ``lock`` says), held until :meth:`close`:
        for a command that reads first and locks only once it has something to change."""
        if self.lock is not None and self.lock.held:
            raise KubevolError(f"the runtime already holds the lock on {lock.root_dir}")
        lock.acquire()
        self.lock = lock

    def close(self) -> None:
        """Close the CSI clients, then let go of the root's lock. Idempotent."""
        registry = getattr(self, "registry", None)  # None: the constructor failed before it
        try:
            if registry is not None:
                registry.close()
        finally:
            if self.lock is not None:
                self.lock.release()


class RecordedPods:
    """A :class:`NodeVolumeManager` whose desired state is the pod records of the root.

    Recorded ``running`` pods are desired; ``terminating`` ones are torn down and their
    record removed once nothing of them is left; pods found on disk without a record are
    not managed (left alone) unless named in ``gone`` (pods the operator says no agent
    runs any more: their volumes are torn down) or ``bindings`` say they left the node
    (default: the runtime's API server, when it has one; none with ``ask_api_server``
    False, as ``up`` runs it: it tears down nothing it was not asked about).
    :meth:`refresh` re-reads changed records; it runs before each pass of :meth:`sync` and
    :meth:`run`.

    The records of ``adding`` (pods already checked and built, :func:`new_pods`) are written
    first, before anything could be mounted, and their desired pods used as they are: they
    are not read back. So are ``terminating`` (records in state ``terminating``, replacing
    those of the same UIDs: ``down``'s), before anything could be torn down; their pods are
    torn down as those of any terminating record.
    """

    def __init__(
        self,
        node: NodeRuntime,
        *,
        adding: Sequence[NewPod] = (),
        terminating: Sequence[PodRecord] = (),
        gone: Iterable[str] = (),
        bindings: PodBindings | None = None,
        ask_api_server: bool = True,
        **kwargs: Any,
    ) -> None:
        self.node = node
        self.watcher = RecordWatcher(node.records)
        if any(r.state is not PodState.TERMINATING for r in terminating):
            raise ValueError("terminating: records in state terminating only")
        # One flush for all the records, not two per pod; not read back (a terminating
        # record's manifests are not needed, and a pod's record is read once, not twice).
        written = [pod.record for pod in adding] + list(terminating)
        for record, stamp in zip(written, node.records.write_many(written), strict=True):
            self.watcher.note(record, stamp)
        self.known: set[str] = set()
        self._records: dict[str, PodRecord] = {}
        #: The UIDs of the records in state ``terminating``: what a pass may end, looked
        #: up without going through every record.
        self._terminating: set[str] = set()
        #: Records whose manifests could not be turned into desired pods, with why.
        self.invalid: dict[str, str] = {}
        #: What this manager may destroy: recorded pods, pods named ``gone``, and device
        #: mounts of the CSI drivers registered here.
        self.ownership = Ownership(
            recorded=lambda: self.known, gone=gone,
            drivers=lambda: {d.name for d in node.registry.drivers()},
            bindings=(bindings if bindings is not None else node.bindings)
            if ask_api_server else None,
        )
        self.manager = NodeVolumeManager(node.host, node.mgr, ownership=self.ownership, **kwargs)
        self.refresh()
        for pod in adding:
            self.manager.set_pod(pod.desired)
        for record in terminating:
            # What refresh does for a terminating record it reads (not read back here).
            self.manager.remove_pod(record.uid)

    def refresh(self) -> None:
        """Bring the desired state in line with the records; retry unregistered drivers."""
        records, changed = self.watcher.refresh()
        self.known = set(records)
        self._records = records
        self._terminating = {
            uid for uid, r in records.items() if r.state is PodState.TERMINATING
        }
        for uid in sorted(changed):
            record = records.get(uid)
            if record is None or record.state is PodState.TERMINATING:
                self.invalid.pop(uid, None)
                self.manager.remove_pod(uid)
                continue
            try:
                manifests = record.manifests()
                self.node.learn(manifests)
                for pod in manifests.pods:
                    self.manager.set_pod(
                        desired_pod(self.node.mgr, pod, manifests, accepted=True))
                self.invalid.pop(uid, None)
            except KubevolError as exc:
                log.error("recorded pod %s cannot be run: %s", uid, exc)
                self.invalid[uid] = str(exc)
        # An unreadable record is skipped: its pod is neither run nor torn down (left alone,
        # as a pod without a record is) until the record is readable or replaced.
        for uid, why in self.watcher.unreadable.items():
            if uid not in self.invalid:
                log.error("pod record %s skipped, its pod left alone: %s", uid, why)
            self.invalid[uid] = why
        for uid in set(self.invalid) - set(records) - set(self.watcher.unreadable):
            del self.invalid[uid]  # the bad record went away
        if self.node.unregistered:
            self.node.ensure_drivers()

    @property
    def records(self) -> Mapping[str, PodRecord]:
        """The records as of the last :meth:`refresh` or :meth:`apply`, by UID."""
        return self._records

    @property
    def terminating(self) -> Set[str]:
        """The UIDs of the records in state ``terminating``: pods being torn down whose
        record is not gone yet."""
        return self._terminating

    def apply(self, adding: Sequence[NewPod] = (), terminating: Sequence[str] = ()) -> None:
        """Record and run ``adding`` (pods already checked and built, replacing the record
        of the same UID) and mark the recorded pods ``terminating`` to be torn down; for a
        long-running caller that decides the desired pods itself. Records are written
        before the desired state changes, so a crash leaves enough on disk to finish."""
        stamps = self.node.records.write_many([pod.record for pod in adding])
        for pod, stamp in zip(adding, stamps, strict=True):
            self.watcher.note(pod.record, stamp)
            self._records[pod.record.uid] = pod.record
            self._terminating.discard(pod.record.uid)
            self.known.add(pod.record.uid)
            self.invalid.pop(pod.record.uid, None)
            self.manager.set_pod(pod.desired)
        for uid in terminating:
            record = self._records.get(uid)
            if record is None or record.state is PodState.TERMINATING:
                continue
            record = attrs.evolve(record, state=PodState.TERMINATING)
            self.watcher.note(record, self.node.records.write(record))
            self._records[uid] = record
            self._terminating.add(uid)
            self.manager.remove_pod(uid)

    def forget_terminated(self) -> list[str]:
        """Remove the records of terminating pods of which nothing is left; their UIDs."""
        done = []
        for uid in sorted(self._terminating):
            # Busy first: an operation that ends updates the actual state before it is no
            # longer busy, so a pod found idle and then unused is really gone.
            if (
                self.manager.reconciler.busy(uid)
                or uid in self.manager.actual.pods()
                or self.manager.has_failures(uid)
                or os.path.lexists(self.node.host.get_pod_dir(uid))
            ):
                continue
            done.append(uid)
        self.node.records.remove_many(done)
        for uid in done:
            self._records.pop(uid, None)
            self._terminating.discard(uid)
        return done

    def reconstruct(self, **kwargs: Any) -> Reconstruction:
        """:meth:`NodeVolumeManager.reconstruct` after a refresh."""
        self.refresh()
        return self.manager.reconstruct(**kwargs)

    def sync(self, timeout: float = 120.0) -> SyncResult:
        """Refresh, reconcile until converged (or stuck, or ``timeout``, or the runtime's
        deadline), forget terminated pods."""
        self.refresh()
        result = self.manager.sync(timeout=self.node.deadline.cap(timeout))
        self.forget_terminated()
        return result

    def run(self, stop: threading.Event, *, period: float = 0.1) -> None:
        """Reconcile until ``stop`` is set, following the records as they change."""

        def before_pass() -> None:
            self.refresh()
            self.forget_terminated()

        self.manager.run(stop, period=period, before_pass=before_pass)

    def close(self, timeout: float | None = None) -> None:
        """Close the volume manager (not the runtime), waiting for its running operations
        at most ``timeout`` seconds (default: what is left of the command's deadline, one
        second at least; no limit without one)."""
        if timeout is None and math.isfinite(left := self.node.deadline.remaining()):
            timeout = max(1.0, left)
        self.manager.close(timeout)


def open_node(root_dir: str, **kwargs: Any) -> NodeRuntime:
    """A :class:`NodeRuntime` on ``root_dir`` (keyword arguments as its constructor's)."""
    return NodeRuntime(root_dir, **kwargs)
