"""The reconciler: each pass starts the operations that move the actual state toward the
desired state (the kubelet's volume manager reconciler), in the kubelet's order:

1. tear down (or unmap) every pod volume that is no longer desired;
2. for every desired pod volume: attach (or wait for attachment), mount the device, then
   set the volume up for the pod (or map it); grow it on the node when a larger size is
   desired (filesystem and block volumes, as the kubelet's ``volumeNeedsExpansion``);
3. for every volume no pod wants and no pod uses any more: unmount the device (or unmap
   it), then detach it, then forget it;
4. remove the directories of pods that are gone once nothing of theirs is left (an
   operation too, keyed by the directory's path: it runs beside the others, and no volume
   of that pod is set up again until it is over).

Operations run through the :class:`~kubevol.node.executor.OperationExecutor`, so a pass
never starts a second operation on a busy key and respects backoff; uncertain states are
treated as "not done" by step 2 and as "maybe done" by steps 1 and 3, so interrupted work is
either finished or undone. ``managed`` limits which pods the reconciler may tear down: pods
it does not manage (found on disk, unknown to the caller) are left alone, and so are the
devices they use. A pass looks once at what processes and other mount namespaces hold under
the pods directory (:mod:`kubevol.node.holders`), when its first tear-down or pod directory
removal asks: what is held is not torn down or removed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from kubevol.errors import KubevolError, TransientOperationError
from kubevol.node.errors import OperationBackoffError, OperationPendingError
from kubevol.node.executor import OperationExecutor, OperationKey, OperationKind
from kubevol.node.holders import HoldersOnce
from kubevol.node.operations import Operation, OperationGenerator, operation_key
from kubevol.node.poddirs import remove_pod_dir
from kubevol.node.state import (
    ActualState,
    AttachedVolume,
    DesiredPod,
    DesiredState,
    MountState,
    VolumeMode,
    VolumeToMount,
)

log = logging.getLogger(__name__)

#: How long one snapshot of what holds paths under the pods directory serves the passes
#: that follow (seconds). A snapshot is never exact (an operation acts after it, on a
#: worker); this bounds how old it may be, at a few of the kubelet's loop periods.
HOLDERS_MAX_AGE = 0.25


def _always(_volume: VolumeToMount) -> bool:
    return True


def _manage_all(_uid: str) -> bool:
    return True


class Reconciler:
    """Starts operations; call :meth:`reconcile` periodically. Thread-safe.

    ``attach_by_node`` makes the node attach volumes itself (no controller); otherwise it
    waits for someone else to attach them.
    """

    def __init__(
        self,
        *,
        desired: DesiredState,
        actual: ActualState,
        executor: OperationExecutor,
        generator: OperationGenerator,
        attach_by_node: bool = True,
        managed: Callable[[str], bool] = _manage_all,
    ) -> None:
        self.desired = desired
        self.actual = actual
        self.executor = executor
        self.generator = generator
        self.attach_by_node = attach_by_node
        self.managed = managed
        #: Seconds between set-ups of mounted volumes whose plugin requires a remount
        #: (configMap, secret, downwardAPI, projected: updates and token refreshes reach
        #: the pod so); None: never (one-shot syncs).
        self.remount_period: float | None = None
        #: Asked of a volume whose periodic set-up is due: whether it may show something
        #: new (default: always, the kubelet's pod sync). Not: it is looked at again a
        #: period later.
        self.remount_wanted: Callable[[VolumeToMount], bool] = _always
        self._set_up_at: dict[tuple[str, str], float] = {}
        #: No value of ``_set_up_at`` is older (a lower bound, exact after each
        #: :meth:`touch_remounts_due` that looked): an idle agent asks every second whether a
        #: periodic set-up is due, and looking at 1,000 volumes each time cost ~0.3 ms.
        self._oldest_set_up = math.inf
        self._pods_to_clean: set[str] = set()
        #: Pod UID -> why its directory's removal was refused last (something holds it).
        self._held_dirs: dict[str, str] = {}
        #: Pods whose directory holds what kubevol leaves alone (a volume of an unknown
        #: plugin): never removed, never waited for.
        self._kept_pod_dirs: set[str] = set()
        #: Pod UID -> how many operations that create or remove its directories run now.
        self._busy: dict[str, int] = {}
        #: What changed since the last pass (pods by UID, volumes by unique name): what a
        #: partial pass (``reconcile(full=False)``) looks at.
        self._dirty_pods: set[str] = set()
        self._dirty_volumes: set[str] = set()
        #: The unique names of each desired pod's volumes as the last pass saw them, and the
        #: desired pods of each unique name (kept by passes).
        self._pod_volumes: dict[str, frozenset[str]] = {}
        self._wanted_by: dict[str, set[str]] = {}
        self._holders: HoldersOnce | None = None
        #: The keys of the periodic set-ups running (of volumes that stay mounted).
        self._periodic: set[OperationKey] = set()
        self._lock = threading.Lock()

    def forget_pod_later(self, uid: str) -> None:
        """Remove pod ``uid``'s directory once it is not desired and nothing of it is left."""
        with self._lock:
            self._pods_to_clean.add(uid)

    def keep_pod_dir(self, uid: str) -> None:
        """Never remove pod ``uid``'s directory, nor wait for its removal."""
        with self._lock:
            self._kept_pod_dirs.add(uid)

    def touch(self, *, pod: str = "", volume: str = "") -> None:
        """Note that pod ``pod`` (its desired pod changed) or volume ``volume`` (an operation
        on it ended) needs a look at the next partial pass. Thread-safe."""
        with self._lock:
            if pod:
                self._dirty_pods.add(pod)
            if volume:
                self._dirty_volumes.add(volume)

    def remount_now(self, pod: DesiredPod) -> None:
        """Set up again at the next pass the volumes of ``pod`` that are set up
        periodically: what the pod is built from changed (a ConfigMap it uses, its
        labels), as the kubelet's sync of an updated pod marks them for a remount. Call it
        with the desired pod replaced (it does not :meth:`touch` the pod)."""
        with self._lock:
            for v in pod.volumes:
                key = (v.unique_name, pod.uid)
                if key in self._set_up_at or self._requires_remount(v):
                    self._followed(key, -math.inf)

    def touch_key(self, key: OperationKey, error: BaseException | None = None) -> bool:
        """:meth:`touch` what an operation on ``key`` changed (call it once the key is free:
        the executor's observer), ended with ``error``; whether a next step may follow.
        None follows the periodic set-up of a volume that stays mounted when it succeeded:
        nothing is touched (a node's thousand configMap and token volumes are set up again
        every minute, and a pass after each would cost more than the set-ups)."""
        with self._lock:
            periodic = key in self._periodic
            self._periodic.discard(key)
        if periodic and error is None:
            return False
        if key.volume.startswith("/"):  # a pod directory's removal: <pods>/<uid>
            self.touch(pod=key.volume.rstrip("/").rsplit("/", 1)[-1])
        else:
            self.touch(pod=key.pod, volume=key.volume)
        return True

    def reconcile(self, *, full: bool = True) -> int:
        """One pass; returns how many operations were started.

        A full pass looks at every desired and actual volume; a partial one (``full``
        False) only at what :meth:`touch` named since the last pass (and at the volumes of
        the pods named), so that its cost follows what changed, not how many pods run.
        What is touched while a pass runs is left for the next one."""
        with self._lock:
            pods, volumes = self._dirty_pods, self._dirty_volumes
            self._dirty_pods, self._dirty_volumes = set(), set()
        holders = self._holders_for_pass()
        if full:
            started = self._unmount_pods(holders, self.actual.volumes())
            started += self._mount_desired()
            started += self._release_devices(self.actual.volumes())
        elif pods or volumes:
            started = self._partial(pods, volumes, holders)
        else:
            started = 0
        started += self._clean_pod_dirs(holders)
        return started

    def _holders_for_pass(self) -> HoldersOnce:
        """The snapshot of what holds paths under the pods directory that this pass asks:
        the last pass's while it is younger than :data:`HOLDERS_MAX_AGE` (passes follow
        each other by milliseconds while pods go: one walk of ``/proc`` serves a pod's
        tear-downs and the removal of its directory), else a new one."""
        with self._lock:
            if self._holders is None or not self._holders.younger_than(HOLDERS_MAX_AGE):
                self._holders = self.generator.holders_once()
            return self._holders

    def _index(self, uids: set[str] | None) -> set[str]:
        """Bring the index of desired volumes up to date for pods ``uids`` (None: every
        pod); the unique names the pods wanted before or want now."""
        if uids is None:
            with self._lock:
                self._pod_volumes, self._wanted_by = {}, {}
            uids = {p.uid for p in self.desired.pods()}
        names: set[str] = set()
        with self._lock:
            for uid in uids:
                pod = self.desired.pod(uid)
                new = frozenset(v.unique_name for v in pod.volumes) if pod else frozenset()
                old = self._pod_volumes.pop(uid, frozenset())
                for name in old - new:
                    wanting = self._wanted_by.get(name)
                    if wanting is not None:
                        wanting.discard(uid)
                        if not wanting:
                            del self._wanted_by[name]
                for name in new:
                    self._wanted_by.setdefault(name, set()).add(uid)
                if pod is not None:
                    self._pod_volumes[uid] = new
                names |= old | new
        return names

    def _partial(self, pods: set[str], volumes: set[str], holders: HoldersOnce) -> int:
        names = sorted(self._index(pods) | volumes)
        found = [av for name in names if (av := self.actual.volume(name)) is not None]
        started = self._unmount_pods(holders, found)
        with self._lock:
            affected = set(pods).union(*(self._wanted_by.get(n, ()) for n in names))
        wanted = [v for uid in sorted(affected) if (p := self.desired.pod(uid)) is not None
                  for v in p.volumes]
        for v in wanted:
            started += self._mount_checked(v)
        found = [av for name in names if (av := self.actual.volume(name)) is not None]
        return started + self._release_devices(found)

    def busy(self, uid: str) -> bool:
        """Whether an operation that may create or remove pod ``uid``'s directories runs."""
        with self._lock:
            return self._busy.get(uid, 0) > 0

    def _start(
        self, kind: OperationKind, unique: str, pod_uid: str, op: Operation, *, pod: str = "",
        periodic: bool = False,
    ) -> int:
        """Start ``op`` under its key; ``pod`` is the pod whose directories it touches;
        ``periodic``: the set-up again of a volume that stays mounted.

        The next partial pass looks at the volume and its pods again (touched by the
        executor's observer once the key is free: :meth:`touch_key`), unless a periodic
        set-up succeeded."""
        key = operation_key(kind, unique, pod_uid, self.generator.node_name)
        with self._lock:
            if pod:
                self._busy[pod] = self._busy.get(pod, 0) + 1
            if periodic:
                self._periodic.add(key)  # before it runs: it may end before run() returns
        if pod:
            op = self._tracked(pod, op)
        try:
            self.executor.run(key, kind, op)
        except (OperationPendingError, OperationBackoffError) as exc:
            if pod:
                self._done(pod)
            with self._lock:
                self._periodic.discard(key)
            log.debug("not starting %s: %s", kind, exc)
            return 0
        return 1

    def _tracked(self, pod: str, op: Operation) -> Operation:
        def run() -> None:
            try:
                op()
            finally:
                self._done(pod)

        return run

    def _done(self, pod: str) -> None:
        with self._lock:
            left = self._busy.get(pod, 0) - 1
            if left > 0:
                self._busy[pod] = left
            else:
                self._busy.pop(pod, None)

    # 1 ------------------------------------------------------------------------------------

    def _unmount_pods(self, holders: HoldersOnce, volumes: list[AttachedVolume]) -> int:
        started = 0
        # Volumes with a device to unmount or detach after their tear-downs start first:
        # theirs is the longest chain, and the operations share one process's turns.
        for av in sorted(volumes, key=_steps_after_tear_down, reverse=True):
            for m in av.pods:
                if not self.managed(m.pod_uid):
                    continue
                if self.desired.is_desired(av.unique_name, m.pod_uid):
                    continue
                self.forget_pod_later(m.pod_uid)
                if av.mode is VolumeMode.BLOCK:
                    started += self._start(
                        OperationKind.UNMAP, av.unique_name, m.pod_uid,
                        self.generator.unmap(av, m), pod=m.pod_uid,
                    )
                else:
                    started += self._start(
                        OperationKind.TEAR_DOWN, av.unique_name, m.pod_uid,
                        self.generator.tear_down(av, m, holders=holders), pod=m.pod_uid,
                    )
        return started

    # 2 ------------------------------------------------------------------------------------

    def _mount_desired(self) -> int:
        started = 0
        self._index(None)
        wanted = self.desired.volumes_to_mount()
        for v in wanted:
            started += self._mount_checked(v)
        if self._set_up_at:
            keep = {(v.unique_name, v.pod_uid) for v in wanted}
            self._set_up_at = {k: t for k, t in self._set_up_at.items() if k in keep}
        return started

    def _mount_checked(self, v: VolumeToMount) -> int:
        try:
            return self._mount_one(v)
        except KubevolError as exc:  # e.g. the plugin went away: report, keep going
            log.warning("cannot reconcile %s for pod %s: %s", v.unique_name, v.pod_uid, exc)
            return 0

    def _mount_one(self, v: VolumeToMount) -> int:
        if self._removing_dir(v.pod_uid):
            return 0  # wanted again while its old directory goes: next pass
        self.actual.add_volume(
            unique_name=v.unique_name,
            volume_name=v.volume_name,
            plugin_name=v.plugin_name,
            spec=v.spec,
            mode=v.mode,
            attachable=v.attachable,
            device_mountable=v.device_mountable,
            device_mount_path=v.device_mount_path,
        )
        av = self.actual.volume(v.unique_name)
        assert av is not None
        if av.attach_state is not MountState.MOUNTED:
            if not v.attachable or self.generator.attaches_nothing(
                v.plugin_name, v.volume_name
            ):
                self.actual.set_attach_state(v.unique_name, MountState.MOUNTED)
            elif self.attach_by_node:
                return self._start(
                    OperationKind.ATTACH, v.unique_name, "", self.generator.attach(v)
                )
            else:
                return self._start(
                    OperationKind.WAIT_FOR_ATTACH, v.unique_name, "",
                    self.generator.wait_for_attach(v),
                )
        pod = self.actual.pod_volume(v.unique_name, v.pod_uid)
        shared = v.attachable or v.device_mountable
        pod_key = "" if shared else v.pod_uid
        if v.mode is VolumeMode.BLOCK:
            if pod is None or pod.state is not MountState.MOUNTED:
                return self._start(
                    OperationKind.MAP, v.unique_name, pod_key, self.generator.map(v),
                    pod=v.pod_uid,
                )
            return self._expand_if_grown(v, av)
        if v.device_mountable and av.device_state is not MountState.MOUNTED:
            return self._start(
                OperationKind.MOUNT_DEVICE, v.unique_name, "", self.generator.mount_device(v)
            )
        mounted = pod is not None and pod.state is MountState.MOUNTED
        if not mounted:
            # This set-up brings what a remount asked for would: the period starts after it.
            self._set_up_at.pop((v.unique_name, v.pod_uid), None)
        if not mounted or self._remount_due(v):
            return self._start(
                OperationKind.SET_UP, v.unique_name, pod_key, self.generator.set_up(v),
                pod=v.pod_uid, periodic=mounted,
            )
        return self._expand_if_grown(v, av)

    def _grown(self, v: VolumeToMount, av: AttachedVolume) -> int | None:
        """The size to expand the mounted (or mapped) volume to on the node, or None: the
        kubelet's ``volumeNeedsExpansion`` (a larger size desired than the volume has, the
        volume not read-only, a plugin that expands on nodes), filesystem and block alike."""
        if v.size is None or av.size is None or v.size <= av.size or v.spec.read_only:
            return None
        if self.generator.mgr.find_node_expandable_plugin_by_name(v.plugin_name) is None:
            return None
        return v.size

    def _expand_if_grown(self, v: VolumeToMount, av: AttachedVolume) -> int:
        size = self._grown(v, av)
        if size is None:
            return 0
        return self._start(OperationKind.EXPAND, v.unique_name, "", self.generator.expand(v, size))

    def _remount_due(self, v: VolumeToMount) -> bool:
        """Whether a mounted volume is due for its periodic set-up (the kubelet's remount
        of volumes whose plugin ``requires_remount``); counts from the first time seen."""
        if self.remount_period is None:
            return False
        key, now = (v.unique_name, v.pod_uid), time.monotonic()
        last = self._set_up_at.get(key)
        if last is None:
            # Only the volumes whose plugin asks for it are followed (remounts_due).
            if self._requires_remount(v):
                self._followed(key, now)
            return False
        if now - last < self.remount_period:
            return False
        self._followed(key, now)
        return self._wanted_again(v, last)

    def _followed(self, key: tuple[str, str], at: float) -> None:
        """Note the volume's last (periodic) set-up ``at``."""
        self._set_up_at[key] = at
        self._oldest_set_up = min(self._oldest_set_up, at)

    def _wanted_again(self, v: VolumeToMount, last: float) -> bool:
        """Whether a volume due for its periodic set-up (last set up at ``last``) is set up
        again: asked for (:meth:`remount_now`), or :attr:`remount_wanted`."""
        return last == -math.inf or self.remount_wanted(v)

    def _requires_remount(self, v: VolumeToMount) -> bool:
        try:
            return self.generator.mgr.find_plugin_by_name(v.plugin_name).requires_remount(v.spec)
        except KubevolError:
            return False  # the plugin went away: the pass reports it

    def touch_remounts_due(self) -> int:
        """:meth:`touch` the pods with a volume due for its periodic set-up that
        :attr:`remount_wanted` wants set up again, so that a partial pass sets it up again
        on time (without a pass over every volume); how many."""
        if self.remount_period is None:
            return 0
        now = time.monotonic()
        oldest = now - self.remount_period
        if self._oldest_set_up > oldest:
            return 0
        due = [(key, last) for key, last in list(self._set_up_at.items()) if last <= oldest]
        touched = 0
        for (unique_name, pod_uid), last in due:
            pod = self.desired.pod(pod_uid)
            if pod is None:
                self._set_up_at.pop((unique_name, pod_uid), None)  # the pod left
                continue
            v = next((v for v in pod.volumes if v.unique_name == unique_name), None)
            if v is not None and not self._wanted_again(v, last):
                self._set_up_at[(unique_name, pod_uid)] = now  # no pass for it
                continue
            self.touch(pod=pod_uid, volume=unique_name)
            touched += 1
        # Those touched stay due until their set-up (``_remount_due``) notes it.
        self._oldest_set_up = min(list(self._set_up_at.values()), default=math.inf)
        return touched

    # 3 ------------------------------------------------------------------------------------

    def _release_devices(self, volumes: list[AttachedVolume]) -> int:
        started = 0
        for av in volumes:
            if av.pods or self.desired.is_desired(av.unique_name):
                continue
            started += self._release_one(av)
        return started

    def _release_one(self, av: AttachedVolume) -> int:
        if av.mode is VolumeMode.BLOCK and av.device_state is not MountState.UNMOUNTED:
            return self._start(
                OperationKind.UNMAP_DEVICE, av.unique_name, "", self.generator.unmap_device(av)
            )
        if av.device_mountable and av.device_state is not MountState.UNMOUNTED:
            return self._start(
                OperationKind.UNMOUNT_DEVICE, av.unique_name, "",
                self.generator.unmount_device(av),
            )
        # Detaching is the node's job only when it attached the volume itself; otherwise the
        # controller that attached it detaches it.
        if self.attach_by_node and av.attachable and av.attach_state is not MountState.UNMOUNTED:
            return self._start(
                OperationKind.DETACH, av.unique_name, "", self.generator.detach(av)
            )
        if not self.executor.is_pending(OperationKey(volume=av.unique_name)):
            self.actual.remove_volume(av.unique_name)
            self.generator.sizes.forget(av.unique_name)
        return 0

    # 4 ------------------------------------------------------------------------------------

    def _clean_pod_dirs(self, holders: HoldersOnce) -> int:
        with self._lock:
            candidates = sorted(self._pods_to_clean - self._kept_pod_dirs)
        if not candidates:
            return 0
        in_use = self.actual.pods()
        ready = [
            uid
            for uid in candidates
            if uid not in in_use
            and self.desired.pod(uid) is None
            and self.managed(uid)
            and not self.busy(uid)
        ]
        return sum(self._remove_pod_dir(uid) for uid in ready if not self._held(uid, holders))

    def _remove_pod_dir(self, uid: str) -> int:
        pod_dir = self.generator.host.get_pod_dir(uid)

        def run() -> None:
            if not remove_pod_dir(pod_dir):
                # Something is left in it (logged by remove_pod_dir): retried later.
                raise TransientOperationError(f"pod {uid}: directory {pod_dir} not removed")
            with self._lock:
                self._pods_to_clean.discard(uid)
                self._held_dirs.pop(uid, None)

        # Keyed by the path: no volume's unique name starts with "/", so it conflicts with
        # nothing but itself.
        return self._start(OperationKind.REMOVE_POD_DIR, pod_dir, "", run, pod=uid)

    def _removing_dir(self, uid: str) -> bool:
        """Whether pod ``uid``'s directory is being removed now."""
        key = OperationKey(volume=self.generator.host.get_pod_dir(uid))
        return self.executor.is_pending(key)

    def _held(self, uid: str, holders: HoldersOnce) -> bool:
        pod_dir = self.generator.host.get_pod_dir(uid)
        why = holders.get().why_refused("remove the pod directory", [pod_dir])
        with self._lock:
            if why:
                if self._held_dirs.get(uid) != why:
                    log.warning("%s", why)
                self._held_dirs[uid] = why
            else:
                self._held_dirs.pop(uid, None)
        return bool(why)

    # --------------------------------------------------------------------------------------

    def pending_work(self) -> list[str]:
        """What keeps the actual state from matching the desired state (empty: converged)."""
        work = []
        for v in self.desired.volumes_to_mount():
            pod = self.actual.pod_volume(v.unique_name, v.pod_uid)
            if pod is None or pod.state is not MountState.MOUNTED:
                state = pod.state.value if pod is not None else "not set up"
                work.append(f"pod {v.pod_uid} volume {v.outer_name!r}: {state}")
                continue
            av = self.actual.volume(v.unique_name)
            size = None if av is None else self._grown(v, av)
            if size is not None:
                work.append(
                    f"pod {v.pod_uid} volume {v.outer_name!r}: not expanded to {size} bytes "
                    f"on the node yet"
                )
        for av in self.actual.volumes():
            for m in av.pods:
                if self.managed(m.pod_uid) and not self.desired.is_desired(
                    av.unique_name, m.pod_uid
                ):
                    work.append(f"pod {m.pod_uid} volume {m.spec_name!r}: still {m.state.value}")
            if not av.pods and not self.desired.is_desired(av.unique_name):
                work.append(f"volume {av.unique_name!r}: device {av.device_state.value}")
        with self._lock:
            dirs = [u for u in self._pods_to_clean - self._kept_pod_dirs if self.managed(u)]
            held = dict(self._held_dirs)
        work += [
            f"pod {uid}: directory not removed yet" + (f" ({held[uid]})" if uid in held else "")
            for uid in sorted(dirs)
        ]
        return work


def _steps_after_tear_down(av: AttachedVolume) -> int:
    """How many operations follow the volume's pod tear-downs: a device unmount, a detach."""
    return (av.device_mountable and av.device_state is not MountState.UNMOUNTED) + (
        av.attachable and av.attach_state is not MountState.UNMOUNTED)
