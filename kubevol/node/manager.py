"""``NodeVolumeManager``: the node volume manager, assembled (the kubelet's volume manager).

It owns the desired and actual states, the operation executor, the reconciler and the
disk-usage check, and offers what a node agent needs::

    manager = NodeVolumeManager(host, plugin_mgr)
    manager.reconstruct()            # after a start or a crash: rebuild from disk
    manager.set_pod(desired_pod(...))
    result = manager.sync(timeout=120)   # or manager.run(stop_event) in a daemon
    manager.remove_pod(uid); manager.sync()
    manager.close()
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import attrs

from kubevol import layout
from kubevol.errors import KubevolError, PluginNotFoundError, is_operation_finished
from kubevol.manager import VolumePluginMgr
from kubevol.mount.subpath import clean_subpaths
from kubevol.node.cleanup import CLEANED, Cleanup, CleanupKind
from kubevol.node.executor import (
    INITIAL_BACKOFF,
    MAX_BACKOFF,
    OperationExecutor,
    OperationFailure,
    OperationKey,
    OperationKind,
    OperationObserver,
)
from kubevol.node.holders import Holders, HoldersOnce
from kubevol.node.host import NodeVolumeHost
from kubevol.node.operations import OperationGenerator
from kubevol.node.orphans import OrphanDeviceMount
from kubevol.node.owners import Ownership, Verdict
from kubevol.node.poddirs import PodVolumeDir, list_pod_volume_dirs
from kubevol.node.reconciler import Reconciler
from kubevol.node.reconstruct import FailedVolume, OrphanSubpath, Reconstruction, scan
from kubevol.node.repair import clean_failed_volume
from kubevol.node.state import ActualState, DesiredPod, DesiredState, MountState
from kubevol.node.usage import VolumeUsage

log = logging.getLogger(__name__)

#: How often a running agent sets up again the volumes that ask for it (the kubelet's sync
#: frequency is one minute).
DEFAULT_REMOUNT_PERIOD = 60.0


@attrs.frozen(kw_only=True)
class SyncResult:
    """How a :meth:`NodeVolumeManager.sync` ended."""

    converged: bool
    #: What is still not as desired (empty when converged).
    pending: tuple[str, ...]
    #: Operations whose last attempt failed.
    failures: tuple[OperationFailure, ...]
    #: True when it stopped early because only final errors were left.
    stuck: bool = False


class NodeVolumeManager:
    """Mounts the volumes of the pods it is told about and unmounts those of pods that left.

    ``ownership`` says which pods found on disk it may tear down, which volumes that could
    not be rebuilt it may clean and which orphan device mounts it may unmount (default:
    every pod, as the kubelet on its own root: :meth:`Ownership.sole_agent`); ``workers``
    threads run operations (0: inline, for tests).
    """

    def __init__(
        self,
        host: NodeVolumeHost,
        mgr: VolumePluginMgr,
        *,
        workers: int = 8,
        attach_by_node: bool = True,
        ownership: Ownership | None = None,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        observer: OperationObserver | None = None,
    ) -> None:
        self.host = host
        self.mgr = mgr
        self.ownership = ownership if ownership is not None else Ownership.sole_agent()
        #: Whether a pod's volumes may be torn down (the one model: :attr:`ownership`).
        self.managed: Callable[[str], bool] = self.ownership
        self.desired = DesiredState()
        self.actual = ActualState()
        self._observer = observer
        #: Called when an operation ended that a next step may follow (not the periodic
        #: set-up of a volume that stays mounted): the agent wakes its loop then.
        self.on_step_end: Callable[[], None] | None = None
        self.executor = OperationExecutor(
            workers=workers, initial_backoff=initial_backoff, max_backoff=max_backoff,
            observer=self._observe,
        )
        self.usage = VolumeUsage(host, mgr)
        self.generator = OperationGenerator(
            host=host, mgr=mgr, actual=self.actual, usage=self.usage
        )
        #: Volumes that could not be rebuilt and are not cleaned yet, by directory.
        self._failed: dict[str, FailedVolume] = {}
        self._failed_lock = threading.Lock()
        self.reconciler = Reconciler(
            desired=self.desired,
            actual=self.actual,
            executor=self.executor,
            generator=self.generator,
            attach_by_node=attach_by_node,
            managed=self.managed,
        )

    def _observe(
        self, key: OperationKey, kind: OperationKind, seconds: float,
        error: BaseException | None,
    ) -> None:
        # The key is free now: the next partial pass looks at what the operation changed.
        follows = self.reconciler.touch_key(key, error)
        if self._observer is not None:
            self._observer(key, kind, seconds, error)
        if follows and self.on_step_end is not None:
            self.on_step_end()

    # -- pods -------------------------------------------------------------------------------

    def set_pod(self, pod: DesiredPod) -> None:
        """Want ``pod`` and its volumes (replacing what was wanted for its UID: the
        volumes set up periodically are then set up again at once)."""
        replaced = self.desired.pod(pod.uid)
        self.desired.set_pod(pod)
        if replaced is not None and replaced != pod:
            self.reconciler.remount_now(pod)
        self.reconciler.touch(pod=pod.uid)

    def remount_pod(self, uid: str) -> None:
        """Set up again at once the volumes of pod ``uid`` that are set up periodically
        (something they project changed); nothing when the pod is not desired."""
        pod = self.desired.pod(uid)
        if pod is not None:
            self.reconciler.remount_now(pod)
            self.reconciler.touch(pod=uid)

    def remove_pod(self, uid: str) -> None:
        """Stop wanting pod ``uid``: its volumes are torn down, its directory removed (and
        its service-account tokens forgotten)."""
        self.desired.remove_pod(uid)
        if self.host.tokens is not None:
            self.host.tokens.forget_pod(uid)
        self.reconciler.forget_pod_later(uid)
        self.reconciler.touch(pod=uid)

    # -- reconstruction ---------------------------------------------------------------------

    def reconstruct(self, *, clean: bool = True) -> Reconstruction:
        """Rebuild the actual state from disk and merge it in (known volumes are kept).

        Pods on disk that :attr:`ownership` gives to kubevol and that are not desired are
        torn down by the reconciler. With ``clean``, volumes that could not be rebuilt are
        cleaned once when ownership allows it and their pod is not desired, and orphan
        device mounts no desired volume claims are unmounted through the guards when
        ownership allows it; what was done, or why not, is in the result.
        """
        result = scan(self.host, self.mgr)
        self.actual.merge(result.actual_state())
        # A volume of an unknown plugin is left alone, so its pod's directory stays too.
        for unknown in result.unknown:
            self.reconciler.keep_pod_dir(unknown.dir.pod_uid)
        # Every other volume directory the scan listed is a found or a failed volume.
        scanned = {f.dir.pod_uid for f in result.volumes} | {
            f.dir.pod_uid for f in result.failures
        }
        for uid in scanned:
            if self.managed(uid) and self.desired.pod(uid) is None:
                self.reconciler.forget_pod_later(uid)
        return self.clean(result) if clean else result

    def pods_on_disk(self) -> set[str]:
        """The UIDs of the pods with volume directories under the root."""
        return {d.pod_uid for d in list_pod_volume_dirs(self.host.get_pods_dir())}

    def clean(self, result: Reconstruction) -> Reconstruction:
        """Clean, once, what :meth:`reconstruct` (with ``clean=False``) found broken and
        ownership allows: volumes that could not be rebuilt (pod not desired), subPath binds
        whose volume directory is gone (pod not desired) and orphan device mounts no desired
        volume claims. Returns ``result`` with what was done."""
        # Listed before anything is cleaned, and only when there is an orphan to judge (a
        # second listing of every pod's volumes at each start-up otherwise).
        pods_on_disk = self.pods_on_disk() if result.orphans else set()
        holders = self.generator.holders_once()
        result = result.with_failures(
            [self._clean_failure(f, holders) for f in result.failures]
        )
        with self._failed_lock:
            for f in result.failures:
                if f.cleanup.kind is CleanupKind.LEFT:
                    # Cleaned later, once, if its pod stops being wanted first.
                    self._failed[f.dir.path] = f
        claimed = self.claimed_device_mounts()
        result = result.with_orphan_subpaths(
            [self._clean_orphan_subpath(o, holders) for o in result.orphan_subpaths]
        )
        return result.with_orphans(
            [self._clean_orphan(o, pods_on_disk) for o in result.orphans
             if o.path not in claimed]
        )

    def orphan_subpath_verdict(self, orphan: OrphanSubpath) -> Verdict:
        """Whether the subPath binds of a volume whose directory is gone may be unmounted
        and removed: only in a pod kubevol owns and no longer wants."""
        verdict = self.ownership.pod(orphan.pod_uid)
        if verdict.allowed and self.desired.pod(orphan.pod_uid) is not None:
            return Verdict(allowed=False, reason="the pod is desired; set-up redoes it")
        return verdict

    def left_alone(self, result: Reconstruction) -> Reconstruction:
        """What :meth:`clean` reports for ``result`` when it may change nothing (a repair
        whose plan has no action): each failure and unclaimed orphan left, with why. Reads
        only."""
        def why(verdict: Verdict, uid: str) -> str:
            if verdict.allowed and self.desired.pod(uid) is not None:
                return "the pod is desired; set-up redoes it"
            return verdict.reason

        pods_on_disk = self.pods_on_disk()
        claimed = self.claimed_device_mounts()
        result = result.with_failures([
            attrs.evolve(f, cleanup=Cleanup.left(why(self.failure_verdict(f), f.dir.pod_uid)))
            for f in result.failures
        ])
        result = result.with_orphan_subpaths([
            attrs.evolve(o, cleanup=Cleanup.left(self.orphan_subpath_verdict(o).reason))
            for o in result.orphan_subpaths
        ])
        return result.with_orphans([
            attrs.evolve(o, cleanup=Cleanup.left(self.orphan_verdict(o, pods_on_disk).reason))
            for o in result.orphans if o.path not in claimed
        ])

    def claimed_device_mounts(self) -> set[str]:
        """The device mount paths of the desired volumes (never orphans)."""
        return {v.device_mount_path for v in self.desired.volumes_to_mount()}

    def failure_verdict(self, failed: FailedVolume) -> Verdict:
        """Whether a volume that could not be rebuilt may be cleaned (its pod not desired)."""
        return self.ownership.volume(
            failed.dir.pod_uid, failed.dir.plugin_name,
            plugin_known=self._plugin_known(failed.dir.plugin_name),
        )

    def orphan_verdict(self, orphan: OrphanDeviceMount, pods_on_disk: set[str]) -> Verdict:
        """Whether an orphan device mount may be unmounted."""
        if orphan.kind != "device":
            return Verdict(allowed=False, reason="block volume mounts are not cleaned here")
        plugins_dir = os.path.join(os.path.realpath(self.host.root_dir), layout.PLUGINS_DIR)
        return self.ownership.device_mount(
            orphan.path, orphan.plugin_name, plugins_dir=plugins_dir,
            pods_on_disk=pods_on_disk,
        )

    def _plugin_known(self, name: str) -> bool:
        try:
            self.mgr.find_plugin_by_name(name)
        except PluginNotFoundError:
            return False
        except KubevolError:
            return False  # several match: nothing knows which one would undo it
        return True

    def volume_held(self, d: PodVolumeDir, holders: Holders, action: str) -> str:
        """Why ``action`` on pod volume ``d`` is refused (a process or another mount
        namespace holds its directory or subPath binds), or ``""``."""
        # d.path, not the filesystem volume path: a block volume's is under volumeDevices.
        return holders.why_refused(
            action, (d.path, self.generator.subpaths_dir(d.pod_uid, d.spec_name))
        )

    def _clean_failure(self, failed: FailedVolume, holders: HoldersOnce) -> FailedVolume:
        uid = failed.dir.pod_uid
        verdict = self.failure_verdict(failed)
        if not verdict.allowed:
            return attrs.evolve(failed, cleanup=Cleanup.left(verdict.reason))
        if self.desired.pod(uid) is not None:
            why = "the pod is desired; set-up redoes it"
            return attrs.evolve(failed, cleanup=Cleanup.left(why))
        held = self.volume_held(failed.dir, holders.get(), "clean")
        if held:
            # Left, not failed: cleaned later (once nothing holds it) by a running agent.
            log.warning("%s", held)
            return attrs.evolve(failed, cleanup=Cleanup.left(held))
        outcome = clean_failed_volume(self.mgr, failed, self.host.get_mounter())
        log.info("volume %s that could not be rebuilt (%s): %s", failed.dir.path,
                 verdict.reason, outcome)
        self.reconciler.forget_pod_later(uid)
        return attrs.evolve(failed, cleanup=outcome)

    def _clean_orphan_subpath(self, orphan: OrphanSubpath, holders: HoldersOnce) -> OrphanSubpath:
        verdict = self.orphan_subpath_verdict(orphan)
        if not verdict.allowed:
            return attrs.evolve(orphan, cleanup=Cleanup.left(verdict.reason))
        why = holders.get().why_refused("unmount the subPath bind", orphan.paths)
        if why:
            log.warning("%s", why)
            return attrs.evolve(orphan, cleanup=Cleanup.left(why))
        try:
            clean_subpaths(self.host.get_mounter(), orphan.pod_dir, orphan.volume)
        except (OSError, KubevolError) as exc:
            return attrs.evolve(orphan, cleanup=Cleanup.failed(str(exc)))
        log.info("%s: %s, unmounted and removed (%s)", orphan.pod_dir, orphan.reason,
                 verdict.reason)
        self.reconciler.forget_pod_later(orphan.pod_uid)
        return attrs.evolve(orphan, cleanup=CLEANED)

    def _clean_orphan(self, orphan: OrphanDeviceMount, pods_on_disk: set[str]) -> OrphanDeviceMount:
        verdict = self.orphan_verdict(orphan, pods_on_disk)
        if not verdict.allowed:
            return attrs.evolve(orphan, cleanup=Cleanup.left(verdict.reason))
        try:
            self.generator.unmount_orphan_device(orphan)()
        except Exception as exc:  # reported to the caller with the orphan
            return attrs.evolve(orphan, cleanup=Cleanup.failed(str(exc)))
        return attrs.evolve(orphan, cleanup=CLEANED)

    # -- running ----------------------------------------------------------------------------

    def has_failures(self, uid: str) -> bool:
        """Whether pod ``uid`` has a volume that could not be rebuilt and is not cleaned."""
        with self._failed_lock:
            return any(f.dir.pod_uid == uid for f in self._failed.values())

    def _follow_failures(self) -> None:
        """Drop failures that set-up redid; clean, once, those whose pod is not wanted now."""
        with self._failed_lock:
            failed = list(self._failed.values())
        holders = self.generator.holders_once()
        for f in failed:
            uid = f.dir.pod_uid
            if self.desired.pod(uid) is not None:
                mounted = any(
                    m.pod_uid == uid and m.spec_name == f.dir.spec_name
                    and m.state is MountState.MOUNTED
                    for m in self.actual.mounted_volumes()
                )
                if not mounted:
                    continue  # set-up will redo it
            elif (
                self.failure_verdict(f).allowed and not self.reconciler.busy(uid)
                and not self.volume_held(f.dir, holders.get(), "clean")
            ):
                outcome = clean_failed_volume(self.mgr, f, self.host.get_mounter())
                log.info("volume %s that could not be rebuilt: %s", f.dir.path, outcome)
                self.reconciler.forget_pod_later(uid)
            else:
                continue
            with self._failed_lock:
                self._failed.pop(f.dir.path, None)

    def reconcile(self, *, full: bool = True) -> int:
        """One reconciler pass (``full`` False: of what changed since the last, see
        :meth:`Reconciler.reconcile`); returns how many operations it started."""
        if self._failed:
            self._follow_failures()
        return self.reconciler.reconcile(full=full)

    def sync(
        self, timeout: float = 120.0, period: float = 0.02, *, give_up_after: float = 5.0
    ) -> SyncResult:
        """Reconcile until the actual state matches the desired state.

        Failed operations are retried as their backoff allows, until ``timeout`` seconds.
        It stops early (``stuck``) when nothing runs and every failing operation failed
        with a final error at least 3 times in this call, the first at least
        ``give_up_after`` seconds ago: a final error may still be the passing outage of a
        driver, which the kubelet would retry for ever.
        """
        deadline = time.monotonic() + timeout
        earlier = {id(f.error) for f in self.executor.failures()}
        #: key -> (first final failure in this call, how many, id of the last error seen)
        finals: dict[object, tuple[float, int, int]] = {}
        while True:
            started = self.reconcile()
            if started:
                # The next pass as soon as half of what runs ended: a pod whose volumes are
                # torn down has its device unstaged and its directory removed while others'
                # tear-downs still run, instead of each step waiting for every pod.
                self.executor.wait_progress(max(0.0, deadline - time.monotonic()))
                continue
            self.executor.wait_idle(max(0.0, deadline - time.monotonic()))
            pending = self.reconciler.pending_work()
            failures = self.executor.failures()
            if not pending:
                # Anything started by the last pass is done: one more pass to be sure.
                if self.reconcile() == 0 and not self.reconciler.pending_work():
                    return SyncResult(converged=True, pending=(), failures=tuple(failures))
                continue
            now = time.monotonic()
            for f in failures:
                if not is_operation_finished(f.error) or id(f.error) in earlier:
                    continue
                first, count, last = finals.get(f.key, (now, 0, 0))
                if id(f.error) != last:
                    finals[f.key] = (first, count + 1, id(f.error))
            if failures and all(
                f.key in finals and finals[f.key][1] >= 3
                and now - finals[f.key][0] >= give_up_after
                and is_operation_finished(f.error)
                for f in failures
            ):
                return SyncResult(
                    converged=False, pending=tuple(pending), failures=tuple(failures), stuck=True
                )
            if time.monotonic() >= deadline:
                return SyncResult(converged=False, pending=tuple(pending), failures=tuple(failures))
            waits = [f.retry_in for f in failures if f.retry_in > 0]
            delay = min(waits) if waits else period
            time.sleep(max(0.0, min(delay, 1.0, deadline - time.monotonic())))

    def run(
        self,
        stop: threading.Event,
        *,
        period: float = 0.1,
        before_pass: Callable[[], None] | None = None,
        remount_period: float = DEFAULT_REMOUNT_PERIOD,
    ) -> None:
        """Reconcile every ``period`` seconds until ``stop`` is set (a daemon's loop).

        ``before_pass`` runs first in every pass, e.g. to refresh the desired pods. Every
        ``remount_period`` seconds, volumes whose plugin requires it are set up again
        (ConfigMap and Secret updates, fresh service-account tokens).
        """
        self.reconciler.remount_period = remount_period
        try:
            while not stop.is_set():
                if before_pass is not None:
                    before_pass()
                self.reconcile()
                stop.wait(period)
        finally:
            self.reconciler.remount_period = None

    def close(self, timeout: float | None = None) -> None:
        """Wait for running operations (at most ``timeout`` seconds: one stuck below a dead
        mount is then left to end with the process, and logged) and release resources.
        Idempotent."""
        for stuck in self.executor.shutdown(wait=True, timeout=timeout):
            log.warning("left running (stuck below an unresponsive mount?): %s", stuck)
