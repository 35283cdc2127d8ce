"""Reconstruction: rebuild the actual state of a node's volumes from what is on disk.

The kubelet's layout says which pod uses which volume::

    pods/<uid>/volumes/<escaped plugin>/<spec name>          filesystem volumes
    pods/<uid>/volumeDevices/<escaped plugin>/<spec name>    block volumes (a device link)

For each entry, :func:`reconstruct_pod_volume` unescapes the plugin name (``~`` → ``/``),
finds the plugin, asks it to ``construct_volume_spec`` (or ``construct_block_volume_spec``)
from the files it keeps there (``vol_data.json`` for CSI), derives the unique volume name
and the device mount path, and checks the mount: mounted, not mounted, corrupted or
missing. Every rebuilt pod volume and device mount is *uncertain*: the reconciler sets it
up again (operations are idempotent) if a pod still wants it, and tears it down otherwise.

Unlike the kubelet, a device-mountable volume whose pod mount is gone is still rebuilt
(uncertain): dropping it would forget its device mount, which would then never be
unmounted. Mounts under ``plugins/`` that no pod volume leads to are reported as orphan
device mounts (a crash between the last tear-down and the device unmount leaves one), and
subPath binds whose volume directory is gone as :class:`OrphanSubpath` (only a repair of
a pod kubevol owns cleans them: :meth:`kubevol.node.manager.NodeVolumeManager.clean`).

A volume that cannot be rebuilt is reported as a :class:`FailedVolume`, never dropped
silently (:mod:`kubevol.node.repair` cleans it once). A volume of a plugin kubevol does not
have (a third-party or out-of-tree plugin) is no failure: it is listed as an
:class:`UnknownPluginVolume`, "unknown plugin, left alone", and nothing ever touches it.
:func:`scan` itself only reads: it creates, writes and removes nothing, so it is safe on a
live kubelet's tree. The pod volume directories are listed by :mod:`kubevol.node.poddirs`,
mounts checked by :mod:`kubevol.node.mountcheck`, orphan device mounts found by
:mod:`kubevol.node.orphans`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from kubevol import layout
from kubevol.errors import KubevolError, PluginNotFoundError
from kubevol.manager import PluginRoles, VolumePluginMgr
from kubevol.mount.interface import MountInterface
from kubevol.mount.subpath import list_subpaths
from kubevol.node.cleanup import NOT_TRIED, Cleanup
from kubevol.node.errors import ReconstructionError
from kubevol.node.host import NodeVolumeHost
from kubevol.node.mountcheck import (
    STILL_MOUNTED,
    MountCheck,
    MountSnapshot,
    check_link,
    check_mount,
    stat_problem,
)
from kubevol.node.orphans import OrphanDeviceMount, find_orphan_device_mounts
from kubevol.node.poddirs import PodVolumeDir, list_entries, list_pod_volume_dirs, pod_dir_of
from kubevol.node.state import (
    AttachedVolume,
    MountedVolume,
    MountState,
    VolumeMode,
    volume_identity,
)
from kubevol.spec import DeferredApiObject, Spec
from kubevol.types import VolumeOptions

log = logging.getLogger(__name__)

#: Mounters are made only to ask their paths: no options (frozen, so one serves all).
_NO_OPTIONS = VolumeOptions()


@attrs.frozen(kw_only=True)
class FoundVolume:
    """A pod volume rebuilt from disk."""

    dir: PodVolumeDir
    unique_name: str
    volume_name: str
    spec: Spec
    attachable: bool
    device_mountable: bool
    #: Where the pod sees the volume (``.../mount`` for CSI, the device link for block).
    mount_path: str
    mount: MountCheck
    #: The device (staging) mount path, or the global map path of a block volume.
    device_mount_path: str
    device: MountCheck | None
    selinux_mount_context: str = ""
    #: The volume's subPath binds under ``volume-subpaths`` (its own references).
    subpaths: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class FailedVolume:
    """A pod volume found on disk that could not be rebuilt, and what was done about it."""

    dir: PodVolumeDir
    reason: str
    cleanup: Cleanup = NOT_TRIED


@attrs.frozen(kw_only=True)
class UnknownPluginVolume:
    """A pod volume of a plugin kubevol does not have: reported, left alone."""

    dir: PodVolumeDir

    @property
    def reason(self) -> str:
        return f"unknown plugin {self.dir.plugin_name!r}, left alone"


@attrs.frozen(kw_only=True)
class OrphanSubpath:
    """The subPath binds of a pod volume whose directory is gone: ``volume-subpaths/<volume>``
    with no ``volumes/*/<volume>`` beside it (a tear-down that stopped half-way, a volume
    directory removed by hand). No volume's tear-down would ever unmount them, and they keep
    the pod directory from being removed."""

    pod_uid: str
    volume: str
    #: ``pods/<uid>``.
    pod_dir: str
    #: The bind targets (``volume-subpaths/<volume>/<container>/<index>``).
    paths: tuple[str, ...]
    #: Those of ``paths`` that are mount points.
    mounted: tuple[str, ...] = ()
    cleanup: Cleanup = NOT_TRIED

    @property
    def reason(self) -> str:
        return f"subPath bind of volume {self.volume!r}, whose volume directory is gone"


@attrs.frozen(kw_only=True)
class Reconstruction:
    """Everything :func:`scan` found."""

    volumes: tuple[FoundVolume, ...]
    failures: tuple[FailedVolume, ...]
    orphans: tuple[OrphanDeviceMount, ...]
    unknown: tuple[UnknownPluginVolume, ...] = ()
    orphan_subpaths: tuple[OrphanSubpath, ...] = ()

    def actual_state(self) -> list[AttachedVolume]:
        """The volumes as actual-state snapshots, every pod and device mount uncertain (set
        up again, idempotently) but an unresponsive pod mount, taken as mounted."""
        grouped: dict[str, list[FoundVolume]] = {}
        for found in self.volumes:
            grouped.setdefault(found.unique_name, []).append(found)
        out = []
        for unique_name, founds in sorted(grouped.items()):
            first = founds[0]
            out.append(
                AttachedVolume(
                    unique_name=unique_name,
                    volume_name=first.volume_name,
                    plugin_name=first.dir.plugin_name,
                    spec=first.spec,
                    mode=first.dir.mode,
                    attachable=first.attachable,
                    device_mountable=first.device_mountable,
                    # Attach is idempotent: "uncertain" makes the reconciler confirm it.
                    attach_state=MountState.UNCERTAIN if first.attachable else MountState.MOUNTED,
                    device_path="",
                    device_mount_path=first.device_mount_path,
                    device_state=(
                        MountState.UNCERTAIN if first.device_mount_path else MountState.UNMOUNTED
                    ),
                    size=None,
                    reconstructed=True,
                    pods=tuple(
                        MountedVolume(
                            unique_name=unique_name,
                            pod_uid=f.dir.pod_uid,
                            spec_name=f.dir.spec_name,
                            outer_name=f.dir.spec_name,
                            # A mount that did not answer is not set up again (that would
                            # wait on it for ever): it stays as it is, reported unresponsive.
                            state=MountState.MOUNTED if f.mount is MountCheck.UNRESPONSIVE
                            else MountState.UNCERTAIN,
                            path=f.mount_path,
                            reconstructed=True,
                        )
                        for f in sorted(founds, key=lambda f: f.dir.pod_uid)
                    ),
                )
            )
        return out

    def with_failures(self, failures: Sequence[FailedVolume]) -> Reconstruction:
        """A copy with ``failures`` replacing the failures (after cleaning them)."""
        return attrs.evolve(self, failures=tuple(failures))

    def with_orphans(self, orphans: Sequence[OrphanDeviceMount]) -> Reconstruction:
        """A copy with ``orphans`` replacing the orphan device mounts."""
        return attrs.evolve(self, orphans=tuple(orphans))

    def with_orphan_subpaths(self, orphans: Sequence[OrphanSubpath]) -> Reconstruction:
        """A copy with ``orphans`` replacing the orphan subPath binds."""
        return attrs.evolve(self, orphan_subpaths=tuple(orphans))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly description."""
        return {
            "volumes": [
                {
                    "pod_uid": f.dir.pod_uid,
                    "plugin": f.dir.plugin_name,
                    "volume": f.dir.spec_name,
                    "mode": f.dir.mode.value,
                    "unique_name": f.unique_name,
                    "path": f.mount_path,
                    "mount": f.mount.value,
                    "device_mount_path": f.device_mount_path,
                    "device": f.device.value if f.device is not None else None,
                    "subpaths": list(f.subpaths),
                }
                for f in self.volumes
            ],
            "failures": [
                {
                    "pod_uid": f.dir.pod_uid,
                    "plugin": f.dir.plugin_name,
                    "volume": f.dir.spec_name,
                    "path": f.dir.path,
                    "reason": f.reason,
                    "cleanup": str(f.cleanup),
                }
                for f in self.failures
            ],
            "unknown_plugins": [
                {
                    "pod_uid": u.dir.pod_uid,
                    "plugin": u.dir.plugin_name,
                    "volume": u.dir.spec_name,
                    "path": u.dir.path,
                    "reason": u.reason,
                }
                for u in self.unknown
            ],
            "orphan_device_mounts": [
                {
                    "path": o.path,
                    "kind": o.kind,
                    "plugin": o.plugin_name,
                    "source": o.source,
                    "fs_type": o.fs_type,
                    "cleanup": str(o.cleanup),
                }
                for o in self.orphans
            ],
            "orphan_subpaths": [
                {
                    "pod_uid": o.pod_uid,
                    "volume": o.volume,
                    "path": path,
                    "mounted": path in o.mounted,
                    "reason": o.reason,
                    "cleanup": str(o.cleanup),
                }
                for o in self.orphan_subpaths
                for path in (o.paths or (os.path.join(o.pod_dir, layout.POD_VOLUME_SUBPATHS_DIR,
                                                      o.volume),))
            ],
        }


def minimal_pod(uid: str) -> Any:
    """A ``V1Pod`` with only its UID: what is known of a pod after a restart. Deferred
    (:class:`~kubevol.spec.DeferredApiObject`): plugins asked for a mounter's path read only
    the UID, and a scan then imports no model class."""
    return DeferredApiObject("V1Pod", {"metadata": {"uid": uid}})


def reconstruct_pod_volume(
    mgr: VolumePluginMgr,
    d: PodVolumeDir,
    mounter: MountInterface,
    *,
    check: bool = True,
    mounts: MountSnapshot | None = None,
) -> FoundVolume:
    """Rebuild one pod volume from disk. Reads only.

    ``check=False`` skips the mount checks (the result then says MISSING/None for them);
    ``mounts`` checks against a snapshot of the mount table instead of asking ``mounter``.
    Raises :class:`~kubevol.node.errors.ReconstructionError` naming the directory and why.
    """
    if not check:
        checker = None
    elif mounts is not None:
        checker = mounts.check
    else:
        checker = functools.partial(check_mount, mounter)
    return ScanPass(mgr, checker).reconstruct(d)


class ScanPass:
    """One pass over pod volume directories (a :func:`scan`, one disk-usage check): rebuilds
    them one by one, reusing across them what one pass may and nothing longer: each
    plugin's roles by name (plugins are not re-probed within a pass), the minimal pod
    of each UID and the names in each pod's ``volume-subpaths``. ``check`` tells what is
    at a path (:meth:`MountSnapshot.check` of the pass's one reading of the mount table);
    None skips mount checks.

    Created by the node layer for the pass and dropped with it. What a plugin derives from
    a Spec is kept with that Spec (:meth:`~kubevol.spec.Spec.derived`), not here: plugins
    are called with the Spec, not with the pass."""

    def __init__(
        self, mgr: VolumePluginMgr, check: Callable[[str], MountCheck] | None = None
    ) -> None:
        self._mgr = mgr
        self._check = check
        self._roles: dict[str, PluginRoles] = {}
        self._pods: dict[str, Any] = {}
        self._subpath_volumes: dict[str, frozenset[str]] = {}

    def reconstruct(self, d: PodVolumeDir) -> FoundVolume:
        """Rebuild ``d`` (:func:`reconstruct_pod_volume`). Reads only. Raises
        :class:`~kubevol.node.errors.ReconstructionError` naming the directory and why."""
        try:
            return self._reconstruct(d)
        except ReconstructionError:
            raise
        except (KubevolError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Plugins read files written by others (or corrupted by a crash): whatever they
            # raise about them makes this one volume unrecoverable, not the whole scan.
            raise ReconstructionError(
                f"cannot reconstruct {d.mode.value.lower()} volume {d.spec_name!r} of pod "
                f"{d.pod_uid} (plugin {d.plugin_name!r}) from {d.path}: {exc}",
                d.path,
            ) from exc

    def knows(self, plugin_name: str) -> bool:
        """Whether the plugin manager has ``plugin_name`` (looked up once per pass)."""
        try:
            self._plugin_roles(plugin_name)
        except PluginNotFoundError:
            return False
        return True

    def _plugin_roles(self, name: str) -> PluginRoles:
        roles = self._roles.get(name)
        if roles is None:
            roles = self._roles[name] = self._mgr.find_roles_by_name(name)
        return roles

    def _pod(self, uid: str) -> Any:
        pod = self._pods.get(uid)
        if pod is None:
            pod = self._pods[uid] = minimal_pod(uid)
        return pod

    def _reconstruct(self, d: PodVolumeDir) -> FoundVolume:
        roles = self._plugin_roles(d.plugin_name)
        plugin, check = roles.plugin, self._check
        selinux = ""
        if d.mode is VolumeMode.BLOCK:
            if roles.mapper is None:
                raise ReconstructionError(
                    f"plugin {d.plugin_name!r} of block volume {d.path} does not map block "
                    "volumes",
                    d.path,
                )
            spec = roles.mapper.construct_block_volume_spec(d.pod_uid, d.spec_name, d.path)
        else:
            reconstructed = plugin.construct_volume_spec(d.spec_name, d.path)
            spec, selinux = reconstructed.spec, reconstructed.selinux_mount_context
        # Asked about the spec, not the plugin: an inline CSI volume is neither attachable
        # nor device-mounted (the kubelet looks plugins up by spec for this; it is the same
        # plugin).
        identity = volume_identity(
            roles.for_spec(spec), spec, pod_uid=d.pod_uid, spec_name=d.spec_name, mode=d.mode
        )
        device_mount_path = identity.device_mount_path
        if d.mode is VolumeMode.BLOCK:
            assert roles.mapper is not None
            # The unmapper only reads what is on disk (a mapper may write its metadata).
            mapper = roles.mapper.new_block_volume_unmapper(d.spec_name, d.pod_uid)
            map_dir, link = mapper.get_pod_device_map_path()
            mount_path = os.path.join(map_dir, link)
            device_mount_path = mapper.get_global_map_path(spec)
            mount = check_link(mount_path) if check is not None else MountCheck.MISSING
            device = None
            if check is not None:
                device = stat_problem(device_mount_path) or MountCheck.MOUNTED
        else:
            mount_path = plugin.new_mounter(spec, self._pod(d.pod_uid), _NO_OPTIONS).get_path()
            # hostPath's "mount path" is the node's own path, not something of the pod.
            own = mount_path if layout.is_within(mount_path, d.path) else ""
            mount = check(own) if check is not None else MountCheck.MISSING
            device = check(device_mount_path) if check is not None and device_mount_path else None
        return FoundVolume(
            dir=d,
            unique_name=identity.unique_name,
            volume_name=identity.volume_name,
            spec=spec,
            attachable=identity.attachable,
            device_mountable=identity.device_mountable,
            mount_path=mount_path,
            mount=mount,
            device_mount_path=device_mount_path,
            device=device,
            selinux_mount_context=selinux,
            subpaths=self._subpaths(d),
        )

    def _subpaths(self, d: PodVolumeDir) -> tuple[str, ...]:
        """The subPath binds of filesystem volume ``d``."""
        if d.mode is not VolumeMode.FILESYSTEM:
            return ()
        pod_dir = pod_dir_of(d.path)
        if d.spec_name not in self.subpath_volumes(pod_dir):
            return ()
        return tuple(list_subpaths(pod_dir, d.spec_name))

    def subpath_volumes(self, pod_dir: str) -> frozenset[str]:
        """The volume names in the pod's ``volume-subpaths``, listed once per pass (most
        volumes have none: one listing per pod, not a failed one per volume)."""
        names = self._subpath_volumes.get(pod_dir)
        if names is None:
            names = self._subpath_volumes[pod_dir] = frozenset(
                list_entries(os.path.join(pod_dir, layout.POD_VOLUME_SUBPATHS_DIR))
            )
        return names

    def orphan_subpaths(
        self, pods_dir: str, dirs: Sequence[PodVolumeDir], pod_uids: Iterable[str] | None
    ) -> list[OrphanSubpath]:
        """The subPath binds under ``pods_dir`` (of ``pod_uids``, else of every pod) whose
        volume has no directory among ``dirs`` (every volume directory of those pods, of
        whatever plugin: an unknown plugin's volume keeps its binds)."""
        names: dict[str, set[str]] = {}
        for d in dirs:
            names.setdefault(d.pod_uid, set()).add(d.spec_name)
        uids = sorted(pod_uids) if pod_uids is not None else sorted(list_entries(pods_dir))
        out = []
        for uid in uids:
            pod_dir = os.path.join(pods_dir, uid)
            for volume in sorted(self.subpath_volumes(pod_dir) - names.get(uid, set())):
                paths = tuple(list_subpaths(pod_dir, volume))
                mounted = tuple(
                    p for p in paths if self._check is not None
                    and self._check(p) in STILL_MOUNTED
                )
                out.append(OrphanSubpath(pod_uid=uid, volume=volume, pod_dir=pod_dir,
                                         paths=paths, mounted=mounted))
        return out


def scan(
    host: NodeVolumeHost,
    mgr: VolumePluginMgr,
    *,
    pod_uids: Iterable[str] | None = None,
) -> Reconstruction:
    """Rebuild every pod volume under the host's root (or only ``pod_uids``'), on the mount
    table the host's mounter gives. Reads only."""
    table = host.get_mounter().table()
    mounts = MountSnapshot(table, host.root_dir, host.probe)
    volumes = ScanPass(mgr, mounts.check)
    found: list[FoundVolume] = []
    failed: list[FailedVolume] = []
    unknown: list[UnknownPluginVolume] = []
    dirs = list_pod_volume_dirs(host.get_pods_dir(), pod_uids)
    for d in dirs:
        if not volumes.knows(d.plugin_name):
            # Another agent's plugin (flexVolume, out-of-tree): normal on a real node.
            log.info("reconstruct: %s: unknown plugin %r, left alone", d.path, d.plugin_name)
            unknown.append(UnknownPluginVolume(dir=d))
            continue
        try:
            found.append(volumes.reconstruct(d))
        except ReconstructionError as exc:
            log.warning("%s", exc)
            failed.append(FailedVolume(dir=d, reason=str(exc)))
    orphans: list[OrphanDeviceMount] = []
    if pod_uids is None:
        orphans = find_orphan_device_mounts(
            host, mgr, mounts=mounts, table=table,
            claimed=[f.device_mount_path for f in found],
            block_names=[f.dir.spec_name for f in found if f.dir.mode is VolumeMode.BLOCK],
        )
    orphan_subpaths = volumes.orphan_subpaths(host.get_pods_dir(), dirs, pod_uids)
    for o in orphan_subpaths:
        log.info("reconstruct: %s: %s", o.pod_dir, o.reason)
    return Reconstruction(
        volumes=tuple(found), failures=tuple(failed), orphans=tuple(orphans),
        unknown=tuple(unknown), orphan_subpaths=tuple(orphan_subpaths),
    )
