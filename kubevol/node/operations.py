"""The volume operations, generated from the plugin bases (the kubelet's operation generator).

Each ``OperationGenerator`` method returns a callable that performs one step on the node
with the volume's plugin and records the outcome in the :class:`~kubevol.node.state.ActualState`,
keeping the retry meaning of the plugin's error:

- success marks the step done (attached, device mounted, set up, ...);
- :class:`~kubevol.errors.UncertainProgressError` marks a step that was not done
  *uncertain* (it may have happened: the reconciler retries it or undoes it);
- a final error on a step that was uncertain marks it not done; on a step that was not
  done it changes nothing, as does :class:`~kubevol.errors.TransientOperationError`.

The error is raised again so the executor backs the key off. :func:`operation_key`
gives each operation the key the kubelet uses, so that, say, a device is never staged
while one of its pods is being torn down.

Unmounting a device is guarded twice, each check run once (again on a fresh mount table
to confirm a refusal made on one that may still list detached mounts): no pod path on disk
may still use the volume (:class:`~kubevol.node.usage.VolumeUsage`), and the plugin's
unstage verdict (``device_unmount_verdict``: the kubelet's ``HasMountRefs`` rule by
default, the unstage guard's policy for CSI) must allow it; that verdict is handed to
``unmount_device``, which does not check again.

Tearing a pod volume down is refused, before anything is touched, while a process or
another mount namespace still holds the volume's directory or its subPath binds
(:mod:`kubevol.node.holders`, the last line of defence).
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kubevol import layout
from kubevol.errors import (
    DeviceStillMountedError,
    KubevolError,
    MountError,
    PluginNotFoundError,
    TransientOperationError,
    UncertainProgressError,
    is_operation_finished,
)
from kubevol.k8s.pod import Pod
from kubevol.manager import VolumePluginMgr
from kubevol.mount.blockmap import (
    map_block_device,
    mapped_pods,
    remove_global_map_path,
    unmap_block_device,
)
from kubevol.mount.guard import UnmountVerdict
from kubevol.mount.helpers import cleanup_mount_point
from kubevol.mount.hungmount import release_hung_mount
from kubevol.mount.probe import UnresponsiveError, is_suspect
from kubevol.mount.table import MountTable
from kubevol.node.errors import VolumeInUseError
from kubevol.node.executor import ANY, OperationKey, OperationKind
from kubevol.node.holders import Holders, HoldersOnce
from kubevol.node.host import NodeVolumeHost
from kubevol.node.mountcheck import STILL_MOUNTED, check_mount
from kubevol.node.orphans import OrphanDeviceMount
from kubevol.node.poddirs import only_leftovers, remove_volume_dir_leftovers
from kubevol.node.sizes import VolumeSizes
from kubevol.node.state import (
    ActualState,
    AttachedVolume,
    MountedVolume,
    MountState,
    VolumeMode,
    VolumeToMount,
)
from kubevol.node.subpaths import set_up_subpaths, tear_down_subpaths, wanted_subpaths
from kubevol.node.usage import VolumeUsage
from kubevol.plugin import DeviceMountableVolumePlugin
from kubevol.plugins.csi.source import READ_WRITE_ONCE_POD
from kubevol.spec import Spec
from kubevol.types import (
    CSIVolumePhase,
    DeviceMounterArgs,
    FSGroupChangePolicy,
    MounterArgs,
    NodeResizeOptions,
    VolumeOptions,
)
from kubevol.volume import CustomBlockVolumeMapper, CustomBlockVolumeUnmapper

log = logging.getLogger(__name__)

_T = TypeVar("_T")

Operation = Callable[[], None]

#: How long a mount waits for its device to be attached (the kubelet's ``waitForAttachTimeout``).
WAIT_FOR_ATTACH_TIMEOUT = datetime.timedelta(minutes=10)


#: The kubelet's words for a second pod wanting such a volume (operation_generator.go).
RWOP_IN_USE = "volume uses the ReadWriteOncePod access mode and is already in use by another pod"


def operation_key(kind: OperationKind, unique_name: str, pod_uid: str, node: str) -> OperationKey:
    """The key an operation runs under.

    Device-wide steps (wait-for-attach, mount/unmount device, unmap device, expand) take
    the whole volume; attach and detach add the node. Set-up and map take the whole volume
    too when it is shared between pods (``pod_uid`` empty), so pods of one device are set up
    one at a time; tear-down and unmap are per pod.
    """
    if kind in (OperationKind.ATTACH, OperationKind.DETACH):
        return OperationKey(volume=unique_name, pod=ANY, node=node)
    if kind in (
        OperationKind.SET_UP,
        OperationKind.MAP,
        OperationKind.TEAR_DOWN,
        OperationKind.UNMAP,
    ):
        return OperationKey(volume=unique_name, pod=pod_uid)
    return OperationKey(volume=unique_name)


def volume_options(spec: Spec) -> VolumeOptions:
    """Mount options and PV name from a PersistentVolume spec; defaults for pod volumes."""
    pv = spec.persistent_volume
    if pv is None:
        return VolumeOptions()
    options = tuple(getattr(pv.spec, "mount_options", None) or ()) if pv.spec else ()
    return VolumeOptions(mount_options=options, pv_name=spec.name())


def mounter_args(pod: Pod, fs_group: int | None) -> MounterArgs:
    """Ownership wishes of ``pod`` (its ``securityContext``)."""
    context = getattr(getattr(pod, "spec", None), "security_context", None)
    policy = getattr(context, "fs_group_change_policy", None)
    return MounterArgs(
        fs_group=fs_group,
        fs_user=getattr(context, "run_as_user", None),
        fs_group_change_policy=FSGroupChangePolicy(policy) if policy else None,
    )


class OperationGenerator:
    """Makes the operations of one node. Every operation is safe to run again."""

    def __init__(
        self,
        *,
        host: NodeVolumeHost,
        mgr: VolumePluginMgr,
        actual: ActualState,
        usage: VolumeUsage,
        wait_for_attach_timeout: datetime.timedelta = WAIT_FOR_ATTACH_TIMEOUT,
    ) -> None:
        self.host = host
        self.mgr = mgr
        self.actual = actual
        self.usage = usage
        self.wait_for_attach_timeout = wait_for_attach_timeout
        #: The size each volume has on the node, kept across restarts.
        self.sizes = VolumeSizes(host.root_dir)

    @property
    def node_name(self) -> str:
        """This node's name."""
        return self.host.get_node_name()

    # -- error bookkeeping (the kubelet's markDeviceErrorState / markVolumeErrorState) ---

    def _device_error(self, unique_name: str, err: BaseException, dmp: str) -> None:
        volume = self.actual.volume(unique_name)
        if volume is None:
            return
        if is_operation_finished(err) and volume.device_state is MountState.UNCERTAIN:
            self.actual.set_device_state(unique_name, MountState.UNMOUNTED)
        elif (
            isinstance(err, UncertainProgressError)
            and volume.device_state is MountState.UNMOUNTED
        ):
            self.actual.set_device_state(unique_name, MountState.UNCERTAIN, dmp)

    def _pod_error(self, v: VolumeToMount, err: BaseException, path: str) -> None:
        current = self.actual.pod_volume(v.unique_name, v.pod_uid)
        state = current.state if current is not None else MountState.UNMOUNTED
        if is_operation_finished(err) and state is MountState.UNCERTAIN:
            self.actual.set_pod_state(v.unique_name, v.pod_uid, MountState.UNMOUNTED)
        elif isinstance(err, UncertainProgressError) and state is MountState.UNMOUNTED:
            self.actual.set_pod_state(
                v.unique_name,
                v.pod_uid,
                MountState.UNCERTAIN,
                spec_name=v.spec_name,
                outer_name=v.outer_name,
                path=path,
            )

    # -- attach ------------------------------------------------------------------------

    def _attachable(self, plugin_name: str) -> Any:
        plugin = self.mgr.find_attachable_plugin_by_name(plugin_name)
        if plugin is None:
            raise PluginNotFoundError(f"volume plugin {plugin_name!r} does not attach volumes")
        return plugin

    def attaches_nothing(self, plugin_name: str, volume_name: str) -> bool:
        """Whether attaching the volume is known to do nothing on this node: its plugin
        says, without calling anyone, that its detach would do nothing
        (:meth:`~kubevol.volume.Detacher.detaches`; a CSI driver without
        PUBLISH_UNPUBLISH_VOLUME on a node that attaches by itself). Such a volume is
        taken as attached with no operation, as the kubelet takes a volume whose plugin
        cannot attach it. Asked in reconciler passes (a restart's first one among them),
        which must not wait on a driver."""
        try:
            plugin = self.mgr.find_attachable_plugin_by_name(plugin_name)
        except KubevolError:
            return False
        return plugin is not None and not plugin.new_detacher().detaches(volume_name, ask=False)

    def attach(self, v: VolumeToMount) -> Operation:
        """Attach the volume to this node (the node attaches it itself)."""

        def run() -> None:
            attacher = self._attachable(v.plugin_name).new_attacher()
            try:
                device_path = attacher.attach(v.spec, self.node_name)
            except UncertainProgressError:
                self.actual.set_attach_state(v.unique_name, MountState.UNCERTAIN)
                raise
            self.actual.set_attach_state(v.unique_name, MountState.MOUNTED, device_path)

        return run

    def wait_for_attach(self, v: VolumeToMount) -> Operation:
        """Wait until someone else (a controller) attached the volume; record its device."""

        def run() -> None:
            attacher = self._attachable(v.plugin_name).new_attacher()
            current = self.actual.volume(v.unique_name)
            known = current.device_path if current is not None else ""
            device_path = attacher.wait_for_attach(
                v.spec, known, v.pod, self.wait_for_attach_timeout
            )
            self.actual.set_attach_state(v.unique_name, MountState.MOUNTED, device_path)

        return run

    def detach(self, av: AttachedVolume) -> Operation:
        """Detach the volume from this node, then forget it. A detach that does something is
        refused while pods use the volume; one that does nothing (the volume was never
        really attached) only forgets it, as the kubelet marks a volume it does not detach
        detached without a check."""

        def run() -> None:
            detacher = self._attachable(av.plugin_name).new_detacher()
            if detacher.detaches(av.volume_name):
                self._on_mount_table(functools.partial(self._refuse_if_used, av))
                detacher.detach(av.volume_name, self.node_name)
            self.actual.set_attach_state(av.unique_name, MountState.UNMOUNTED)
            self.actual.remove_volume(av.unique_name)
            self.sizes.forget(av.unique_name)

        return run

    # -- device mount --------------------------------------------------------------------

    def _device_mountable(self, plugin_name: str) -> Any:
        plugin = self.mgr.find_device_mountable_plugin_by_name(plugin_name)
        if plugin is None:
            raise PluginNotFoundError(f"volume plugin {plugin_name!r} does not mount devices")
        return plugin

    def mount_device(self, v: VolumeToMount) -> Operation:
        """Mount (stage) the device at its global path once for every pod."""

        def run() -> None:
            plugin = self._device_mountable(v.plugin_name)
            device_mounter = plugin.new_attacher() if v.attachable else plugin.new_device_mounter()
            dmp = device_mounter.get_device_mount_path(v.spec)
            self.host.make_plugins_dir()
            current = self.actual.volume(v.unique_name)
            device_path = current.device_path if current is not None else ""
            try:
                if v.attachable:
                    device_path = device_mounter.wait_for_attach(
                        v.spec, device_path, v.pod, self.wait_for_attach_timeout
                    )
                device_mounter.mount_device(
                    v.spec, device_path, dmp, DeviceMounterArgs(fs_group=v.fs_group)
                )
            except Exception as exc:
                self._device_error(v.unique_name, exc, dmp)
                raise
            self.actual.set_device_state(v.unique_name, MountState.MOUNTED, dmp)
            if device_path:
                self.actual.set_attach_state(v.unique_name, MountState.MOUNTED, device_path)

        return run

    def _refuse_if_used(self, av: AttachedVolume, table: MountTable | None = None) -> None:
        users = self.usage.users(av.unique_name, av.plugin_name, av.mode, table=table)
        if users:
            raise VolumeInUseError(
                f"volume {av.unique_name!r} is still used by pods on disk: {', '.join(users)}",
                users,
            )

    def _on_mount_table(self, check: Callable[[MountTable], _T], *, at: str | None = None) -> _T:
        """``check`` on the mount table, read again only to confirm a refusal.

        Both guards refuse only on mounts they find, so a table that may still list mounts
        detached since it was read (``superset``: not even read again while the tree only
        shrank, as in a tear-down) allows exactly what a fresh one would."""
        table = self.usage.table(superset=True, at=at)
        try:
            return check(table)
        except (VolumeInUseError, DeviceStillMountedError):
            fresh = self.usage.table()
            if fresh is table:
                raise
            return check(fresh)

    def unmount_device(self, av: AttachedVolume) -> Operation:
        """Unmount (unstage) the device once no pod uses it, through both guards."""

        def run() -> None:
            plugin = self._device_mountable(av.plugin_name)
            dmp = av.device_mount_path or plugin.new_device_mounter().get_device_mount_path(
                av.spec
            )
            # One reading of the mount table for both checks.
            verdict = self._on_mount_table(
                functools.partial(self._unstage_verdict, av, plugin, dmp), at=dmp)
            self._unmount_device_path(plugin, dmp, av.unique_name, verdict)
            self.actual.set_device_state(av.unique_name, MountState.UNMOUNTED)

        return run

    def _unstage_verdict(
        self, av: AttachedVolume, plugin: DeviceMountableVolumePlugin, dmp: str,
        table: MountTable,
    ) -> UnmountVerdict:
        """Both checks on ``table``: no pod on disk uses the volume, and the plugin's
        verdict allows the unmount. Raises :class:`VolumeInUseError` or
        :class:`DeviceStillMountedError` to refuse."""
        self._refuse_if_used(av, table)
        self._release_hung_mounts([dmp])
        verdict = plugin.device_unmount_verdict(dmp, table=table)
        verdict.raise_if_blocked()
        return verdict

    def unmount_orphan_device(self, orphan: OrphanDeviceMount) -> Operation:
        """Unmount a device mount no pod volume leads to, through the mount-reference guard."""

        def run() -> None:
            if not orphan.plugin_name:
                raise PluginNotFoundError(
                    f"no registered plugin owns the mount {orphan.path}; left in place"
                )
            plugin = self._device_mountable(orphan.plugin_name)
            verdict = plugin.device_unmount_verdict(orphan.path)
            verdict.raise_if_blocked()
            self._unmount_device_path(plugin, orphan.path, None, verdict)

        return run

    def _unmount_device_path(
        self,
        plugin: DeviceMountableVolumePlugin,
        dmp: str,
        unique_name: str | None,
        verdict: UnmountVerdict,
    ) -> None:
        try:
            plugin.new_device_unmounter().unmount_device(dmp, verdict=verdict)
        except Exception:
            if unique_name is not None:
                self.actual.set_device_state(unique_name, MountState.UNCERTAIN)
            raise

    # -- set up / tear down ------------------------------------------------------------------

    def _refuse_if_another_pod_has_it(self, v: VolumeToMount) -> None:
        """The kubelet's ReadWriteOncePod rule (operation_generator.go, before a set-up or a
        map): a PersistentVolume whose only access mode is ReadWriteOncePod is set up for
        no second pod while another pod has it mounted, or may have (uncertain). Nothing
        has changed yet, so the refusal is retried: the pod gets the volume once the other
        pod's use of it has ended."""
        if not v.spec.is_persistent_volume:
            return
        pv_spec = v.spec.persistent_volume.spec
        if list(getattr(pv_spec, "access_modes", None) or ()) != [READ_WRITE_ONCE_POD]:
            return
        current = self.actual.volume(v.unique_name)
        if current is not None and any(
            p.pod_uid != v.pod_uid and p.state is not MountState.UNMOUNTED for p in current.pods
        ):
            raise TransientOperationError(RWOP_IN_USE)

    def set_up(self, v: VolumeToMount) -> Operation:
        """Set the volume up for the pod (publish, bind, create the directory...)."""

        def run() -> None:
            self._refuse_if_another_pod_has_it(v)
            plugin = self.mgr.find_plugin_by_name(v.plugin_name)
            mounter = plugin.new_mounter(v.spec, v.pod, volume_options(v.spec))
            path = mounter.get_path()
            try:
                self.host.make_pod_dirs(v.pod_uid)
                mounter.set_up(mounter_args(v.pod, v.fs_group))
            except Exception as exc:
                self._pod_error(v, exc, path)
                raise
            try:
                set_up_subpaths(self.host, wanted_subpaths(
                    self.host, v.pod, pod_uid=v.pod_uid, outer_name=v.outer_name,
                    spec_name=v.spec_name, volume_path=path,
                ))
            except Exception:
                # Set up, but its containers cannot use it yet: uncertain, so it is set up
                # again (and its subPaths retried), or torn down if the pod goes.
                self.actual.set_pod_state(
                    v.unique_name, v.pod_uid, MountState.UNCERTAIN,
                    spec_name=v.spec_name, outer_name=v.outer_name, path=path,
                )
                raise
            self.actual.set_pod_state(
                v.unique_name,
                v.pod_uid,
                MountState.MOUNTED,
                spec_name=v.spec_name,
                outer_name=v.outer_name,
                path=path,
            )
            self._learn_size(v)

        return run

    def _learn_size(self, v: VolumeToMount) -> None:
        """Once the volume is set up or mapped, the size it has on the node when not known
        yet (the kubelet's ``InitializeClaimSize``): the size recorded under the root (it
        was on the node before this process, perhaps smaller than asked now: then the
        reconciler expands it), else the size the claim's status reports (an expansion
        done while no pod used the volume leaves it below the size asked: the reconciler
        then expands it on the node, as the kubelet does for offline expansion), else
        the size asked for; recorded."""
        volume = self.actual.volume(v.unique_name)
        if volume is None or volume.size is not None or v.size is None:
            return
        size = self.sizes.get(v.unique_name)
        if size is None:
            size = v.claim_size if v.claim_size is not None else v.size
            self.sizes.set(v.unique_name, size)
        self.actual.set_size(v.unique_name, size)

    def holders_once(self) -> HoldersOnce:
        """What holds paths under the pods directory, for one batch of operations (one
        walk of ``/proc``, when the first of them asks; our own mounts from the mount table's
        owner)."""
        pods_dir = self.host.get_pods_dir()
        return HoldersOnce(lambda: Holders.take(pods_dir, own_table=self.usage.table()))

    def pod_volume_paths(self, pod_uid: str, plugin_name: str, spec_name: str) -> list[str]:
        """What tearing down a pod volume unmounts or removes: its directory and its
        subPath binds."""
        return [
            self.host.get_pod_volume_dir(pod_uid, plugin_name, spec_name),
            self.subpaths_dir(pod_uid, spec_name),
        ]

    def subpaths_dir(self, pod_uid: str, spec_name: str) -> str:
        """``pods/<uid>/volume-subpaths/<volume>``: the volume's subPath binds."""
        return os.path.join(
            self.host.get_pod_dir(pod_uid), layout.POD_VOLUME_SUBPATHS_DIR, spec_name
        )

    def tear_down(
        self, av: AttachedVolume, m: MountedVolume, *, holders: HoldersOnce | None = None
    ) -> Operation:
        """Tear the pod's volume down; the pod is then forgotten for this volume.

        Refused (:class:`~kubevol.node.holders.VolumeHeldError`, nothing touched) while
        ``holders`` (a fresh snapshot when None) says a process or another mount namespace
        holds the volume's directory or subPath binds.
        """

        def run() -> None:
            plugin = self.mgr.find_plugin_by_name(av.plugin_name)
            paths = self.pod_volume_paths(m.pod_uid, av.plugin_name, m.spec_name)
            (holders or self.holders_once()).get().refuse("tear down", paths)
            self._release_hung_mounts(paths)
            # The kubelet removes the subPath binds of a volume before the volume itself.
            tear_down_subpaths(self.host, m.pod_uid, m.spec_name)
            try:
                plugin.new_unmounter(m.spec_name, m.pod_uid).tear_down()
            except Exception:
                # A tear-down interrupted by a crash may leave only the plugin's metadata
                # (or half of it), which the plugin then cannot read: finish it then.
                vol_dir = self.host.get_pod_volume_dir(m.pod_uid, av.plugin_name, m.spec_name)
                mounter = self.host.get_mounter()
                if not os.path.isdir(vol_dir) or not only_leftovers(vol_dir, mounter, plugin):
                    raise
                log.warning("finishing the tear-down of %s: only leftovers remain", vol_dir)
                remove_volume_dir_leftovers(vol_dir, mounter, plugin)
            self._finish_tear_down(m.path)
            self.actual.set_pod_state(av.unique_name, m.pod_uid, MountState.UNMOUNTED)

        return run

    def _release_hung_mounts(self, paths: Iterable[str]) -> None:
        """mount-utils' policy for what is being torn down or unstaged and sits on a dead
        server or a frozen FUSE daemon: each network or FUSE mount at or below ``paths``
        (kubevol's own paths of a volume it has decided to remove) that does not answer a
        ``stat`` within the probe's deadline is unmounted, then unmounted with force, then
        detached lazily (:mod:`kubevol.mount.hungmount`); the tear-down then goes on on the
        directory beneath, which is kubevol's. Raises when such a mount stays: nothing below
        it is touched. Mounts that answer, and those that fail at once (ENOTCONN: a dead
        mount the plugins' checks know), are left to the plugin."""
        probe = self.host.probe
        table = self.usage.table(superset=True)
        for path in paths:
            # Deepest first: a subPath bind or a nested mount goes before what holds it.
            for entry in reversed(table.mounted_under(self.host.real_path(path))):
                if not is_suspect(entry.fs_type):
                    continue
                try:
                    probe.call(entry.mount_point, path, "stat",
                               functools.partial(os.stat, entry.mount_point))
                    continue
                except UnresponsiveError as exc:
                    stuck = exc
                except OSError:
                    continue
                released = release_hung_mount(probe, entry.mount_point)
                log.warning("%s; %s, nothing below it deleted", stuck, released)

    def _finish_tear_down(self, path: str) -> None:
        """Unmount what a plugin's tear-down left mounted (a dead mount it did not see)."""
        if not path:
            return
        try:
            os.lstat(path)
        except FileNotFoundError:
            return  # removed by the tear-down: nothing can be mounted there (one lookup)
        except OSError:
            pass  # a dead mount answers ENOTCONN or the like: look closer
        if not layout.is_below(os.path.realpath(path), self.host.real_pods_dir):
            return  # not the pod's own path (hostPath): nothing of ours to check
        mounter = self.host.get_mounter()
        if check_mount(mounter, path) in STILL_MOUNTED:
            log.warning("tear-down left %s mounted; unmounting it", path)
            cleanup_mount_point(path, mounter)

    # -- block -----------------------------------------------------------------------------

    def _mapper_plugin(self, plugin_name: str) -> Any:
        plugin = self.mgr.find_mapper_plugin_by_name(plugin_name)
        if plugin is None:
            raise PluginNotFoundError(f"volume plugin {plugin_name!r} does not map block volumes")
        return plugin

    def map(self, v: VolumeToMount) -> Operation:
        """Map a block volume into the pod: stage the device, publish it, then link it at the
        pod's device path and bind it under the global map path (one file per pod)."""

        def run() -> None:
            self._refuse_if_another_pod_has_it(v)
            plugin = self._mapper_plugin(v.plugin_name)
            mapper = plugin.new_block_volume_mapper(v.spec, v.pod, volume_options(v.spec))
            self.host.make_pod_dirs(v.pod_uid)
            self.host.make_plugins_dir()
            global_map_path = mapper.get_global_map_path(v.spec)
            map_dir, link = mapper.get_pod_device_map_path()
            pod_link = os.path.join(map_dir, link)
            current = self.actual.volume(v.unique_name)
            device_path = current.device_path if current is not None else ""
            if isinstance(mapper, CustomBlockVolumeMapper) and (
                current is None or current.device_state is not MountState.MOUNTED
            ):
                try:
                    mapper.set_up_device()
                except Exception as exc:
                    self._device_error(v.unique_name, exc, global_map_path)
                    raise
            self.actual.set_device_state(v.unique_name, MountState.MOUNTED, global_map_path)
            try:
                if isinstance(mapper, CustomBlockVolumeMapper):
                    published = mapper.map_pod_device()
                    if published and published != device_path:
                        # As the kubelet (MarkDeviceAsMounted again with the path MapPodDevice
                        # returned): what a node expansion of the block volume is given.
                        self.actual.set_attach_state(
                            v.unique_name, MountState.MOUNTED, published
                        )
                    device_path = published or device_path
                if not device_path:
                    raise MountError(f"block volume {v.unique_name!r} has no device path to map")
                map_block_device(
                    self.host.get_mounter(), device_path=device_path,
                    global_map_path=global_map_path, pod_device_dir=map_dir,
                    volume_map_name=link, pod_uid=v.pod_uid,
                )
            except Exception as exc:
                self._pod_error(v, exc, pod_link)
                if not isinstance(exc, UncertainProgressError):
                    # Mapping may have been half done: make sure it is undone later.
                    self.actual.set_pod_state(
                        v.unique_name, v.pod_uid, MountState.UNCERTAIN,
                        spec_name=v.spec_name, outer_name=v.outer_name, path=pod_link,
                    )
                raise
            self.actual.set_pod_state(
                v.unique_name, v.pod_uid, MountState.MOUNTED,
                spec_name=v.spec_name, outer_name=v.outer_name, path=pod_link,
            )
            self._learn_size(v)

        return run

    def unmap(self, av: AttachedVolume, m: MountedVolume) -> Operation:
        """Undo :meth:`map` for one pod: the plugin's unmap (CSI: NodeUnpublishVolume)
        first, then the bind and last the pod's device link. The link is the record of what
        to undo (a restarted agent finds the pod's block volumes by it): were it removed
        before an unpublish that fails (a driver down), the publish and the device would
        leak, with nothing left to say so (the kubelet removes it first)."""

        def run() -> None:
            plugin = self._mapper_plugin(av.plugin_name)
            unmapper = plugin.new_block_volume_unmapper(m.spec_name, m.pod_uid)
            global_map_path = av.device_mount_path or unmapper.get_global_map_path(av.spec)
            map_dir, link = unmapper.get_pod_device_map_path()
            if isinstance(unmapper, CustomBlockVolumeUnmapper):
                unmapper.unmap_pod_device()
            unmap_block_device(
                self.host.get_mounter(), global_map_path=global_map_path,
                pod_device_dir=map_dir, volume_map_name=link, pod_uid=m.pod_uid,
            )
            self.actual.set_pod_state(av.unique_name, m.pod_uid, MountState.UNMOUNTED)

        return run

    def unmap_device(self, av: AttachedVolume) -> Operation:
        """Tear the block device down once no pod maps it."""

        def run() -> None:
            plugin = self._mapper_plugin(av.plugin_name)
            # No pod is concerned here: like the kubelet, pass an empty pod UID.
            unmapper = plugin.new_block_volume_unmapper(av.spec.name(), "")
            global_map_path = av.device_mount_path or unmapper.get_global_map_path(av.spec)
            self._refuse_if_used(av)
            refs = mapped_pods(self.host.get_mounter(), global_map_path)
            if refs:
                raise DeviceStillMountedError(
                    f"the block device of {av.unique_name!r} is still mapped for pods {refs}",
                    refs,
                )
            try:
                if isinstance(unmapper, CustomBlockVolumeUnmapper):
                    unmapper.tear_down_device(global_map_path, av.device_path)
                remove_global_map_path(global_map_path)
            except Exception:
                self.actual.set_device_state(av.unique_name, MountState.UNCERTAIN)
                raise
            self.actual.set_device_state(av.unique_name, MountState.UNMOUNTED)

        return run

    # -- expand ------------------------------------------------------------------------------

    def expand(self, v: VolumeToMount, new_size: int) -> Operation:
        """Grow the volume on the node to ``new_size`` bytes, with the kubelet's resize
        options (its ``GenerateExpandInUseVolumeFunc``): for a filesystem volume, the pod's
        mount path and the device's mount (staging) path; for a block volume, the device
        path the map step published and, when the mapper stages, its staging path."""

        def run() -> None:
            plugin = self.mgr.find_node_expandable_plugin_by_name(v.plugin_name)
            if plugin is None:
                raise PluginNotFoundError(f"volume plugin {v.plugin_name!r} cannot expand on nodes")
            current = self.actual.volume(v.unique_name)
            if current is None:
                raise KubevolError(f"volume {v.unique_name!r} is not on the node")
            if plugin.requires_fs_resize():
                if v.mode is VolumeMode.BLOCK:
                    mount_path, stage_path = "", self._block_staging_path(v)
                else:
                    pod = self.actual.pod_volume(v.unique_name, v.pod_uid)
                    mount_path = pod.path if pod is not None else ""
                    stage_path = current.device_mount_path
                done = plugin.node_expand(
                    NodeResizeOptions(
                        volume_spec=v.spec,
                        device_path=current.device_path,
                        device_mount_path=mount_path,
                        device_stage_path=stage_path,
                        new_size=new_size,
                        old_size=current.size or 0,
                        csi_volume_phase=CSIVolumePhase.PUBLISHED,
                    )
                )
                if not done:
                    raise UncertainProgressError(
                        f"expansion of {v.unique_name!r} to {new_size} bytes is not complete yet"
                    )
            self.actual.set_size(v.unique_name, new_size)
            self.sizes.set(v.unique_name, new_size)

        return run

    def _block_staging_path(self, v: VolumeToMount) -> str:
        """Where a custom block mapper staged the device ("" for other mappers)."""
        mapper = self._mapper_plugin(v.plugin_name).new_block_volume_mapper(
            v.spec, v.pod, volume_options(v.spec)
        )
        return mapper.get_staging_path() if isinstance(mapper, CustomBlockVolumeMapper) else ""
