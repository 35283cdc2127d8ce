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
device mounts (a crash between the last tear-down and the device unmount leaves one).

A volume that cannot be rebuilt is reported as a :class:`FailedVolume`, never dropped
silently; :func:`clean_failed_volume` cleans it once (tear-down if the plugin can, else
unmount and ``rmdir`` only, never a recursive delete). :func:`scan` itself only reads:
it creates, writes and removes nothing, so it is safe on a live kubelet's tree.
"""

from __future__ import annotations

import enum
import errno
import functools
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from kubevol import layout
from kubevol.errors import KubevolError, PluginNotFoundError
from kubevol.host import NodeVolumeHost
from kubevol.layout import PodVolumeEntry
from kubevol.manager import PluginRoles, VolumePluginMgr
from kubevol.mount.helpers import cleanup_mount_point, is_corrupted_error
from kubevol.mount.interface import Mounter as MountInterface
from kubevol.mount.table import MountTable, read_mountinfo_bytes
from kubevol.node.errors import ReconstructionError
from kubevol.node.state import (
    AttachedVolume,
    MountedVolume,
    MountState,
    VolumeMode,
    unique_volume_name,
)
from kubevol.plugin import VolumePlugin
from kubevol.spec import Spec, api_object
from kubevol.types import VolumeOptions

log = logging.getLogger(__name__)

_MODE_DIRS = (
    (layout.POD_VOLUMES_DIR, VolumeMode.FILESYSTEM),
    (layout.POD_VOLUME_DEVICES_DIR, VolumeMode.BLOCK),
)
#: Mounters are made only to ask their paths: no options (frozen, so one serves all).
_NO_OPTIONS = VolumeOptions()


class MountCheck(enum.StrEnum):
    """What was found at a volume's mount path (or device link, for block volumes)."""

    MOUNTED = "mounted"
    NOT_MOUNTED = "not-mounted"
    CORRUPTED = "corrupted"
    MISSING = "missing"
    #: The plugin keeps nothing at a pod path (hostPath).
    NONE = "none"


@attrs.frozen(kw_only=True)
class PodVolumeDir:
    """One entry of a pod's ``volumes`` or ``volumeDevices`` directory."""

    pod_uid: str
    plugin_name: str
    spec_name: str
    path: str
    mode: VolumeMode


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


@attrs.frozen(kw_only=True)
class FailedVolume:
    """A pod volume found on disk that could not be rebuilt, and what was done about it."""

    dir: PodVolumeDir
    reason: str
    #: "" (nothing tried yet), "cleaned", "left: <why>" or "failed: <error>".
    cleanup: str = ""


@attrs.frozen(kw_only=True)
class OrphanDeviceMount:
    """A mount under ``plugins/`` that no pod volume on disk leads to."""

    path: str
    plugin_name: str
    source: str
    fs_type: str
    #: ``device`` for a device (staging) mount, ``block`` for a mount of a block volume's
    #: layout (``plugins/<plugin>/volumeDevices/...``), which is reported, never unmounted.
    kind: str = "device"
    cleanup: str = ""


@attrs.frozen(kw_only=True)
class Reconstruction:
    """Everything :func:`scan` found."""

    volumes: tuple[FoundVolume, ...]
    failures: tuple[FailedVolume, ...]
    orphans: tuple[OrphanDeviceMount, ...]

    def actual_state(self) -> list[AttachedVolume]:
        """The volumes as actual-state snapshots, every pod and device mount uncertain."""
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
                            state=MountState.UNCERTAIN,
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
                    "cleanup": f.cleanup,
                }
                for f in self.failures
            ],
            "orphan_device_mounts": [
                {
                    "path": o.path,
                    "kind": o.kind,
                    "plugin": o.plugin_name,
                    "source": o.source,
                    "fs_type": o.fs_type,
                    "cleanup": o.cleanup,
                }
                for o in self.orphans
            ],
        }


def list_pod_volume_dirs(
    pods_dir: str, pod_uids: Iterable[str] | None = None
) -> list[PodVolumeDir]:
    """Every ``pods/<uid>/{volumes,volumeDevices}/<plugin>/<name>`` entry, sorted.

    Only reads directories; a missing ``pods_dir`` gives ``[]``. ``pod_uids`` limits the
    walk to those pods.
    """
    if pod_uids is not None:
        pods = [(uid, os.path.join(pods_dir, uid)) for uid in sorted(pod_uids)]
    else:
        pods = _list_dirs(pods_dir, dirs_only=True)
    out: list[PodVolumeDir] = []
    for uid, pod_dir in pods:
        for kind, mode in _MODE_DIRS:
            for escaped, plugin_dir in _list_dirs(f"{pod_dir}/{kind}", dirs_only=True):
                plugin = layout.unescape_plugin_name(escaped)
                for name, path in _list_dirs(plugin_dir, dirs_only=False):
                    out.append(
                        PodVolumeDir(
                            pod_uid=uid, plugin_name=plugin, spec_name=name, path=path, mode=mode
                        )
                    )
    return out


def _list_dirs(path: str, *, dirs_only: bool) -> list[tuple[str, str]]:
    """(name, path) of the entries of ``path`` (only directories with ``dirs_only``),
    sorted by name; ``[]`` when ``path`` is missing or a corrupted mount."""
    try:
        with os.scandir(path) as entries:
            found = [
                (e.name, e.path)
                for e in entries
                if not dirs_only or e.is_dir(follow_symlinks=False)
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        if is_corrupted_error(exc):
            log.warning("reconstruct: %s is a corrupted mount, skipped", path)
            return []
        raise
    found.sort()
    return found


def check_mount(mounter: MountInterface, path: str) -> MountCheck:
    """Whether ``path`` is a mount point, a plain directory, a dead mount or missing."""
    if not path:
        return MountCheck.NONE
    try:
        # stat first: the mount check may answer from cached attributes of a dead mount.
        os.stat(path)
        not_mount = mounter.is_likely_not_mount_point(path)
    except FileNotFoundError:
        return MountCheck.MISSING
    except OSError as exc:
        if is_corrupted_error(exc):
            return MountCheck.CORRUPTED
        raise
    return MountCheck.NOT_MOUNTED if not_mount else MountCheck.MOUNTED


def check_link(path: str) -> MountCheck:
    """For a block volume's device link: MOUNTED when it leads to a device, else why not."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return MountCheck.MISSING
    # A dangling link: the device is gone.
    return _stat_problem(path, missing=MountCheck.NOT_MOUNTED) or MountCheck.MOUNTED


def _stat_problem(path: str, *, missing: MountCheck = MountCheck.MISSING) -> MountCheck | None:
    """None when ``path`` can be stat-ed; ``missing`` when it does not exist, CORRUPTED when
    it is a dead mount. Other errors are raised."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return missing
    except OSError as exc:
        if is_corrupted_error(exc):
            return MountCheck.CORRUPTED
        raise
    return None


def minimal_pod(uid: str) -> Any:
    """A ``V1Pod`` with only its UID: what is known of a pod after a restart."""
    return api_object("V1Pod", {"metadata": {"uid": uid}})


class MountSnapshot:
    """Mount checks against one reading of the mount table (a whole scan sees one moment,
    and a set lookup is cheaper than a ``statx`` per path). ``root_dir`` is the root the
    checked paths are under, translated to its real path once."""

    def __init__(self, table: MountTable, root_dir: str) -> None:
        self.points = {e.mount_point for e in table.entries()}
        self._root = os.path.abspath(root_dir)
        self._real_root = os.path.realpath(root_dir)

    def real(self, path: str) -> str:
        """``path`` with symbolic links resolved (cheaply for paths under the root)."""
        if layout.is_within(path, self._root):
            return self._real_root + path[len(self._root):]
        return os.path.realpath(path)

    def check(self, path: str) -> MountCheck:
        """:func:`check_mount` by the snapshot."""
        if not path:
            return MountCheck.NONE
        problem = _stat_problem(path)
        if problem is not None:
            return problem
        return MountCheck.MOUNTED if self.real(path) in self.points else MountCheck.NOT_MOUNTED


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
    return _Scan(mgr, checker).reconstruct(d)


class _Scan:
    """Rebuilds pod volumes one by one, reusing across them what one scan may: the plugins
    by name and the minimal pods by UID (a scan is one moment; plugins are not
    re-probed between its volumes). ``check`` tells what is at a path; None skips checks."""

    def __init__(self, mgr: VolumePluginMgr, check: Callable[[str], MountCheck] | None) -> None:
        self._mgr = mgr
        self._check = check
        self._roles: dict[str, PluginRoles] = {}
        self._pods: dict[str, Any] = {}

    def reconstruct(self, d: PodVolumeDir) -> FoundVolume:
        """:func:`reconstruct_pod_volume` of ``d``."""
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
        for_spec = roles.for_spec(spec)
        device_plugin, attachable = for_spec.device_mountable, for_spec.attachable is not None
        volume_name = plugin.get_volume_name(spec)
        unique = unique_volume_name(
            d.plugin_name,
            volume_name,
            shared=device_plugin is not None or attachable,
            pod_uid=d.pod_uid,
            spec_name=d.spec_name,
        )
        device_mount_path = ""
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
                device = _stat_problem(device_mount_path) or MountCheck.MOUNTED
        else:
            mount_path = plugin.new_mounter(spec, self._pod(d.pod_uid), _NO_OPTIONS).get_path()
            if device_plugin is not None:
                device_mount_path = device_plugin.new_device_mounter().get_device_mount_path(spec)
            # hostPath's "mount path" is the node's own path, not something of the pod.
            own = mount_path if layout.is_within(mount_path, d.path) else ""
            mount = check(own) if check is not None else MountCheck.MISSING
            device = check(device_mount_path) if check is not None and device_mount_path else None
        return FoundVolume(
            dir=d,
            unique_name=unique,
            volume_name=volume_name,
            spec=spec,
            attachable=attachable,
            device_mountable=device_plugin is not None,
            mount_path=mount_path,
            mount=mount,
            device_mount_path=device_mount_path,
            device=device,
            selinux_mount_context=selinux,
        )


def scan(
    host: NodeVolumeHost,
    mgr: VolumePluginMgr,
    *,
    pod_uids: Iterable[str] | None = None,
    mountinfo_path: str = "/proc/self/mountinfo",
) -> Reconstruction:
    """Rebuild every pod volume under the host's root (or only ``pod_uids``'). Reads only."""
    table = MountTable(read_mountinfo_bytes(mountinfo_path))
    mounts = MountSnapshot(table, host.root_dir)
    volumes = _Scan(mgr, mounts.check)
    found: list[FoundVolume] = []
    failed: list[FailedVolume] = []
    for d in list_pod_volume_dirs(host.get_pods_dir(), pod_uids):
        try:
            found.append(volumes.reconstruct(d))
        except ReconstructionError as exc:
            log.warning("%s", exc)
            failed.append(FailedVolume(dir=d, reason=str(exc)))
    orphans: list[OrphanDeviceMount] = []
    if pod_uids is None:
        orphans = find_orphan_device_mounts(host, mgr, found, mounts=mounts, table=table)
    return Reconstruction(volumes=tuple(found), failures=tuple(failed), orphans=tuple(orphans))


def find_orphan_device_mounts(
    host: NodeVolumeHost,
    mgr: VolumePluginMgr,
    found: Iterable[FoundVolume],
    *,
    mountinfo_path: str = "/proc/self/mountinfo",
    claimed: Iterable[str] = (),
    mounts: MountSnapshot | None = None,
    table: MountTable | None = None,
) -> list[OrphanDeviceMount]:
    """Mounts under ``<root>/plugins/`` that none of ``found`` (or ``claimed`` paths) use.

    ``table`` (and ``mounts`` made from it) are a mount table already read; else it is
    read from ``mountinfo_path``.
    """
    if table is None:
        table = MountTable(read_mountinfo_bytes(mountinfo_path))
    if mounts is None:
        mounts = MountSnapshot(table, host.root_dir)
    plugins_dir = os.path.join(os.path.realpath(host.root_dir), layout.PLUGINS_DIR)
    found = list(found)
    known = {mounts.real(f.device_mount_path) for f in found if f.device_mount_path}
    known |= {mounts.real(p) for p in claimed if p}
    block_names = {f.dir.spec_name for f in found if f.dir.mode is VolumeMode.BLOCK}
    out: dict[str, OrphanDeviceMount] = {}
    for entry in table.entries():
        point = entry.mount_point
        if not layout.is_below(point, plugins_dir) or point in out:
            continue
        if _self_or_ancestor_in(point, known, plugins_dir):
            continue
        rel = point[len(plugins_dir) + 1 :].split("/")
        kind = "device"
        block = layout.block_segments(rel)
        if block is not None:
            # Staging, publish and map paths of block volumes are named by the volume's
            # spec name; those of a rebuilt block volume are its own.
            if block_names & set(block):
                continue
            kind = "block"
        out[point] = OrphanDeviceMount(
            path=point,
            plugin_name=_plugin_of(mgr, rel),
            source=entry.source,
            fs_type=entry.fs_type,
            kind=kind,
        )
    return list(out.values())


def _self_or_ancestor_in(path: str, paths: set[str], stop: str) -> bool:
    """Whether ``path`` or one of its ancestors below ``stop`` is in ``paths``."""
    while len(path) > len(stop):
        if path in paths:
            return True
        path = os.path.dirname(path)
    return False


def _plugin_of(mgr: VolumePluginMgr, segments: list[str]) -> str:
    """The registered plugin whose directory holds ``plugins/<segments>``, or ``""``."""
    for name in layout.plugin_name_candidates(segments):
        try:
            mgr.find_plugin_by_name(name)
        except PluginNotFoundError:
            continue
        except KubevolError:
            return ""
        return name
    return ""


def clean_failed_volume(mgr: VolumePluginMgr, failed: FailedVolume, mounter: MountInterface) -> str:
    """Clean a volume that could not be rebuilt, once; returns what was done.

    The plugin's unmounter tears it down when the plugin is known; otherwise, or when that
    fails, the directories the plugin mounts at (its :meth:`~VolumePlugin.pod_volume_entry`
    hook tells) and the directory itself are unmounted if mounted, and removed only if
    nothing but the plugin's leftovers remain. Data is never deleted through a mount.
    """
    d = failed.dir
    if d.mode is VolumeMode.BLOCK:
        try:
            if os.path.islink(d.path):
                os.unlink(d.path)
            return "cleaned"
        except OSError as exc:
            return f"failed: cannot remove the device link {d.path}: {exc.strerror}"
    first_error = ""
    plugin: VolumePlugin | None = None
    try:
        plugin = mgr.find_plugin_by_name(d.plugin_name)
        plugin.new_unmounter(d.spec_name, d.pod_uid).tear_down()
        if not os.path.lexists(d.path):
            return "cleaned"
    except Exception as exc:  # the plugin could not: fall back to a plain unmount below
        first_error = f"{type(exc).__name__}: {exc}"
    try:
        for name in _entries(d.path):
            if _entry(plugin, name) is PodVolumeEntry.MOUNT_DIR:
                cleanup_mount_point(os.path.join(d.path, name), mounter)
        if os.path.isdir(d.path) and not mounter.is_likely_not_mount_point(d.path):
            cleanup_mount_point(d.path, mounter)
        remove_volume_dir_leftovers(d.path, mounter, plugin)
    except OSError as exc:
        why = f"{exc}" + (f" (plugin tear-down: {first_error})" if first_error else "")
        return f"failed: {why}"
    return "cleaned"


def _entries(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _entry(plugin: VolumePlugin | None, name: str) -> PodVolumeEntry:
    """What ``name`` in a pod volume directory of ``plugin`` is; pod data when the plugin is
    unknown (``None``)."""
    return plugin.pod_volume_entry(name) if plugin is not None else PodVolumeEntry.DATA


def only_leftovers(path: str, mounter: MountInterface, plugin: VolumePlugin | None) -> bool:
    """Whether the pod volume directory ``path`` of ``plugin`` holds nothing but what a
    tear-down leaves when interrupted: the plugin's metadata and empty, unmounted
    directories it mounts at (the plugin's :meth:`~VolumePlugin.pod_volume_entry` says
    which names those are)."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if check_mount(mounter, path) in (MountCheck.MOUNTED, MountCheck.CORRUPTED):
        return False
    for name in names:
        entry = _entry(plugin, name)
        if entry is PodVolumeEntry.METADATA:
            continue
        sub = os.path.join(path, name)
        if entry is not PodVolumeEntry.MOUNT_DIR or os.path.islink(sub) or not os.path.isdir(sub):
            return False
        if check_mount(mounter, sub) is not MountCheck.NOT_MOUNTED or os.listdir(sub):
            return False
    return True


def remove_volume_dir_leftovers(
    path: str, mounter: MountInterface, plugin: VolumePlugin | None
) -> None:
    """Remove a pod volume directory that :func:`only_leftovers` approves: the plugin's
    metadata files, its empty mount directories, itself. Anything else stops it with
    ``OSError`` before pod data could be touched (``rmdir`` only)."""
    if not os.path.isdir(path):
        return
    if not only_leftovers(path, mounter, plugin):
        raise OSError(errno.ENOTEMPTY, f"{path} holds more than a plugin's leftovers")
    for name in os.listdir(path):
        sub = os.path.join(path, name)
        if _entry(plugin, name) is PodVolumeEntry.METADATA:
            os.unlink(sub)
        else:
            os.rmdir(sub)
    os.rmdir(path)
