"""The kubelet's on-disk layout, in one place: every path under the kubelet root is built
here, and every path found on disk (or in the mount table) is described here::

    plugins/<plugin>/                                          a plugin's node-wide data
    plugins/<plugin>/volumeDevices/                            ... for block volumes
    plugins_registry/                                          drivers' registration sockets
    pods/<uid>/volumes/<escaped plugin>/<volume>               a pod's volume
    pods/<uid>/volumeDevices/<escaped plugin>/<volume>         a pod's block device link
    pods/<uid>/plugins/<escaped plugin>/                       a plugin's data about one pod
    pods/<uid>/volume-subpaths/<volume>/<container>/<index>    subPath bind mounts

A plugin name's ``/`` nests under ``plugins/`` and is escaped as ``~`` under ``pods/``. The
``kubernetes.io/csi`` plugin lays out its own files (upstream's ``csi_attacher.go``,
``csi_mounter.go``, ``csi_block.go``)::

    plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/globalmount     device mount
    plugins/kubernetes.io/csi/<driver>/<sha256hex(handle)>/vol_data.json
    plugins/kubernetes.io/csi/pv/<pv>/globalmount                          before v1.24
    pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount                    pod mount
    pods/<uid>/volumes/kubernetes.io~csi/<volume>/vol_data.json
    plugins/kubernetes.io/csi/volumeDevices/<volume>/dev                   block global map
    plugins/kubernetes.io/csi/volumeDevices/<volume>/data/vol_data.json
    plugins/kubernetes.io/csi/volumeDevices/staging/<volume>               block staging
    plugins/kubernetes.io/csi/volumeDevices/publish/<volume>/<pod uid>     block publish

Builders take the root without its trailing ``/`` (``""`` for ``/``) or a directory another
builder returned, validate every name that becomes a segment (:func:`validate_path_segment`),
and join with ``/`` as strings: they run several times per volume, and ``os.path.join`` was
a tenth of reconstruction time. :func:`describe` is their inverse: pure, it reads nothing.

The bottom layer also holds the two file-system primitives everything above shares: the
durable atomic file write and the path-containment test.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import attrs

from kubevol.errors import InvalidPathSegmentError
from kubevol.util import jsontext

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Longest file name Linux accepts (NAME_MAX).
MAX_SEGMENT_BYTES = 255

PLUGINS_DIR = "plugins"
PLUGINS_REGISTRY_DIR = "plugins_registry"
PODS_DIR = "pods"
#: The sub-directory of a plugin's directory for block volumes.
VOLUME_DEVICES_DIR = "volumeDevices"
#: Kinds of directories under ``pods/<uid>/``.
POD_VOLUMES_DIR = "volumes"
POD_VOLUME_DEVICES_DIR = "volumeDevices"
POD_PLUGINS_DIR = "plugins"
POD_VOLUME_SUBPATHS_DIR = "volume-subpaths"
#: The directories under ``pods/<uid>/`` that hold volumes (what a pod's removal waits for).
POD_VOLUME_KINDS = (POD_VOLUMES_DIR, POD_VOLUME_DEVICES_DIR, POD_VOLUME_SUBPATHS_DIR)

CSI_PLUGIN_NAME = "kubernetes.io/csi"
CSI_GLOBAL_MOUNT_DIR = "globalmount"
CSI_POD_MOUNT_DIR = "mount"
CSI_VOL_DATA_FILE = "vol_data.json"
#: vol_data.json is written atomically through a temporary file named so; one may be left
#: behind when the writer is killed.
CSI_VOL_DATA_TEMP_PREFIX = ".vol_data."
#: Directory names of the CSI plugin's block layout under ``plugins/kubernetes.io/csi/``.
CSI_BLOCK_DEV = "dev"
CSI_BLOCK_DATA_DIR = "data"
CSI_BLOCK_STAGING_DIR = "staging"
CSI_BLOCK_PUBLISH_DIR = "publish"
#: Before Kubernetes 1.24, CSI device mounts were named by PV: ``csi/pv/<pv>/globalmount``.
CSI_LEGACY_PV_DIR = "pv"


# --- names ---------------------------------------------------------------------------------


def validate_path_segment(value: str, what: str) -> str:
    """Return ``value`` if it is safe as one path segment, else raise InvalidPathSegmentError.

    Refused: empty, ``.``, ``..``, anything with ``/`` or NUL, over 255 bytes.
    """
    if not isinstance(value, str):
        raise InvalidPathSegmentError(f"{what} must be a string, got {type(value).__name__}")
    if value in ("", ".", ".."):
        raise InvalidPathSegmentError(f"{what} {value!r} is not a valid path segment")
    if "/" in value or "\0" in value:
        raise InvalidPathSegmentError(f"{what} {value!r} must not contain '/' or NUL")
    # A character is at most 4 bytes in UTF-8: short names need no encoding to check.
    if len(value) * 4 > MAX_SEGMENT_BYTES:
        size = len(value.encode("utf-8", "surrogateescape"))
        if size > MAX_SEGMENT_BYTES:
            raise InvalidPathSegmentError(
                f"{what} is {size} bytes long; at most {MAX_SEGMENT_BYTES} are allowed"
            )
    return value


def escape_plugin_name(name: str) -> str:
    """``kubernetes.io/csi`` → ``kubernetes.io~csi`` (the kubelet's ``EscapeQualifiedName``)."""
    return name.replace("/", "~")


def unescape_plugin_name(escaped: str) -> str:
    """``kubernetes.io~csi`` → ``kubernetes.io/csi``."""
    return escaped.replace("~", "/")


def plugin_name_segments(name: str) -> list[str]:
    """The segments a plugin name nests as under ``plugins/`` (at most two), validated."""
    return list(_plugin_name_segments(name))


# A node has a handful of plugin names and builds their paths several times per volume:
# each name is split and validated once (a bad name raises every time: errors are not kept).
@functools.lru_cache(maxsize=256)
def _plugin_name_segments(name: str) -> tuple[str, ...]:
    parts = name.split("/")
    if len(parts) > 2:
        raise InvalidPathSegmentError(f"plugin name {name!r} has more than one '/'")
    return tuple(validate_path_segment(p, "plugin name part") for p in parts)


def sha256_hex(text: str) -> str:
    """``sha256hex``, as the CSI plugin names device mount directories by volume handle."""
    return hashlib.sha256(text.encode()).hexdigest()


# --- building: the node-wide tree -------------------------------------------------------------


def _join(base: str, *segments: str) -> str:
    return "/".join((base, *segments))


def plugin_dir(root: str, plugin_name: str) -> str:
    """``plugins/<plugin>``."""
    return _join(root, PLUGINS_DIR, *_plugin_name_segments(plugin_name))


def volume_device_plugin_dir(root: str, plugin_name: str) -> str:
    """``plugins/<plugin>/volumeDevices``."""
    return _join(plugin_dir(root, plugin_name), VOLUME_DEVICES_DIR)


def plugins_registry_dir(root: str) -> str:
    """``plugins_registry``."""
    return _join(root, PLUGINS_REGISTRY_DIR)


def pods_dir(root: str) -> str:
    """``pods``."""
    return _join(root, PODS_DIR)


def pod_dir(root: str, pod_uid: str) -> str:
    """``pods/<uid>``."""
    return _join(root, PODS_DIR, validate_path_segment(pod_uid, "pod UID"))


@functools.lru_cache(maxsize=256)  # as _plugin_name_segments
def _escaped_plugin_segment(plugin_name: str) -> str:
    return validate_path_segment(escape_plugin_name(plugin_name), "plugin name")


# Flat joins, not built on pod_dir: reconstruction builds these several times per volume.
def _pod_plugin_sub_dir(root: str, pod_uid: str, kind: str, plugin_name: str) -> str:
    return "/".join((
        root,
        PODS_DIR,
        validate_path_segment(pod_uid, "pod UID"),
        kind,
        _escaped_plugin_segment(plugin_name),
    ))


def pod_volume_dir(root: str, pod_uid: str, plugin_name: str, volume_name: str) -> str:
    """``pods/<uid>/volumes/<escaped plugin>/<volume>``."""
    return "/".join((
        root,
        PODS_DIR,
        validate_path_segment(pod_uid, "pod UID"),
        POD_VOLUMES_DIR,
        _escaped_plugin_segment(plugin_name),
        validate_path_segment(volume_name, "volume name"),
    ))


def pod_plugin_dir(root: str, pod_uid: str, plugin_name: str) -> str:
    """``pods/<uid>/plugins/<escaped plugin>``."""
    return _pod_plugin_sub_dir(root, pod_uid, POD_PLUGINS_DIR, plugin_name)


def pod_volume_device_dir(root: str, pod_uid: str, plugin_name: str) -> str:
    """``pods/<uid>/volumeDevices/<escaped plugin>``."""
    return _pod_plugin_sub_dir(root, pod_uid, POD_VOLUME_DEVICES_DIR, plugin_name)


def pod_subpath_dir(
    root: str, pod_uid: str, volume_name: str, container_name: str, index: int
) -> str:
    """``pods/<uid>/volume-subpaths/<volume>/<container>/<index>`` (a subPath bind mount)."""
    return _join(
        pod_dir(root, pod_uid),
        POD_VOLUME_SUBPATHS_DIR,
        validate_path_segment(volume_name, "volume name"),
        validate_path_segment(container_name, "container name"),
        str(int(index)),
    )


# --- building: the CSI plugin's files ---------------------------------------------------------


def csi_device_mount_path(csi_plugin_dir: str, driver: str, handle: str) -> str:
    """``<csi plugin dir>/<driver>/<sha256hex(handle)>/globalmount``."""
    if not handle:
        raise ValueError("the CSI volume handle is empty")
    return _join(
        csi_plugin_dir,
        validate_path_segment(driver, "CSI driver name"),
        sha256_hex(handle),
        CSI_GLOBAL_MOUNT_DIR,
    )


def csi_pod_mount_path(pod_volume_dir: str) -> str:
    """``<pod volume dir>/mount``: where a pod sees a CSI volume."""
    return _join(pod_volume_dir, CSI_POD_MOUNT_DIR)


def csi_vol_data_path(directory: str) -> str:
    """``<directory>/vol_data.json``."""
    return _join(directory, CSI_VOL_DATA_FILE)


def _csi_spec_segment(spec_name: str) -> str:
    return validate_path_segment(escape_plugin_name(spec_name), "volume spec name")


def csi_block_volume_dir(block_dir: str, spec_name: str) -> str:
    """``<csi volumeDevices dir>/<spec>``."""
    return _join(block_dir, _csi_spec_segment(spec_name))


def csi_block_global_map_path(block_dir: str, spec_name: str) -> str:
    """``<csi volumeDevices dir>/<spec>/dev``."""
    return _join(csi_block_volume_dir(block_dir, spec_name), CSI_BLOCK_DEV)


def csi_block_data_dir(block_dir: str, spec_name: str) -> str:
    """``<csi volumeDevices dir>/<spec>/data`` (holds vol_data.json)."""
    return _join(csi_block_volume_dir(block_dir, spec_name), CSI_BLOCK_DATA_DIR)


def csi_block_staging_path(block_dir: str, spec_name: str) -> str:
    """``<csi volumeDevices dir>/staging/<spec>``."""
    return _join(block_dir, CSI_BLOCK_STAGING_DIR, _csi_spec_segment(spec_name))


def csi_block_publish_dir(block_dir: str, spec_name: str) -> str:
    """``<csi volumeDevices dir>/publish/<spec>``."""
    return _join(block_dir, CSI_BLOCK_PUBLISH_DIR, _csi_spec_segment(spec_name))


def csi_block_publish_path(block_dir: str, spec_name: str, pod_uid: str) -> str:
    """``<csi volumeDevices dir>/publish/<spec>/<pod uid>``."""
    return _join(
        csi_block_publish_dir(block_dir, spec_name), validate_path_segment(pod_uid, "pod UID")
    )


class PodVolumeEntry(enum.Enum):
    """What an entry directly inside a pod volume directory is, to its plugin."""

    #: The pod's data (or anything the plugin does not know): never removed by cleanup.
    DATA = "data"
    #: A file the plugin keeps about the volume (and a half-written copy of one).
    METADATA = "metadata"
    #: The directory the plugin mounts the volume at: removable once unmounted and empty.
    MOUNT_DIR = "mount-dir"


def csi_pod_volume_entry(name: str) -> PodVolumeEntry:
    """What ``name`` in a CSI pod volume directory is: vol_data.json (or the temporary file
    of an interrupted write of it), the ``mount`` directory, or else pod data."""
    if name == CSI_VOL_DATA_FILE or name.startswith(CSI_VOL_DATA_TEMP_PREFIX):
        return PodVolumeEntry.METADATA
    if name == CSI_POD_MOUNT_DIR:
        return PodVolumeEntry.MOUNT_DIR
    return PodVolumeEntry.DATA


# --- describing -------------------------------------------------------------------------------


class PathRole(enum.StrEnum):
    """What a path under the kubelet root is for."""

    DEVICE_MOUNT = "device-mount"
    POD_VOLUME = "pod-volume"
    POD_SUBPATH = "pod-subpath"
    BLOCK = "block"


@attrs.frozen(kw_only=True)
class LayoutPath:
    """What the layout alone says about one path under the kubelet root (see :func:`describe`).

    Paths named by a CSI volume's spec name or PV do not tell its driver and handle: their
    ``vol_data.json`` does, at ``vol_data_dir``.
    """

    role: PathRole
    #: None for a subPath mount (its path names the volume, not the plugin).
    plugin_name: str | None
    #: The volume: its name in the pod (pod paths, CSI block paths), in-tree device mount's
    #: last segment, the PV (CSI before v1.24), or ``sha256hex(handle)`` (CSI device mount).
    volume_name: str
    pod_uid: str | None = None
    #: The CSI driver of a device mount (its directory says so).
    csi_driver: str | None = None
    #: Relative path of the directory whose vol_data.json tells this CSI volume, or None.
    vol_data_dir: str | None = None


def describe(rel: str) -> LayoutPath | None:
    """What ``rel`` (a path relative to the kubelet root) is in the layout; None when it is
    in no layout the kubelet uses. Pure: reads nothing."""
    segs = [s for s in rel.split("/") if s]
    if len(segs) >= 4 and segs[0] == PLUGINS_DIR:
        return _describe_plugin_path(segs)
    if len(segs) >= 5 and segs[0] == PODS_DIR:
        return _describe_pod_path(segs)
    return None


def _describe_plugin_path(segs: list[str]) -> LayoutPath | None:
    plugin = f"{segs[1]}/{segs[2]}"
    if plugin != CSI_PLUGIN_NAME:
        # In-tree device mounts: plugins/<plugin>/.../<volume>[/globalmount].
        rest = [s for s in segs[3:] if s not in (CSI_GLOBAL_MOUNT_DIR, CSI_POD_MOUNT_DIR)]
        name = rest[-1] if rest else segs[3]
        return LayoutPath(role=PathRole.DEVICE_MOUNT, plugin_name=plugin, volume_name=name)
    if segs[3] == VOLUME_DEVICES_DIR and len(segs) >= 5:
        pod = None
        if segs[4] in (CSI_BLOCK_STAGING_DIR, CSI_BLOCK_PUBLISH_DIR) and len(segs) >= 6:
            spec = segs[5]
            if segs[4] == CSI_BLOCK_PUBLISH_DIR and len(segs) >= 7:
                pod = segs[6]
        else:
            spec = segs[4]
        return LayoutPath(
            role=PathRole.BLOCK,
            plugin_name=CSI_PLUGIN_NAME,
            volume_name=spec,
            pod_uid=pod,
            vol_data_dir=_csi_block_data_rel(spec),
        )
    if len(segs) < 5:
        return None
    legacy = segs[3] == CSI_LEGACY_PV_DIR
    return LayoutPath(
        role=PathRole.DEVICE_MOUNT,
        plugin_name=CSI_PLUGIN_NAME,
        volume_name=segs[4],
        csi_driver=None if legacy else segs[3],
        vol_data_dir="/".join(segs[:5]),
    )


def _describe_pod_path(segs: list[str]) -> LayoutPath | None:
    uid, kind = segs[1], segs[2]
    if kind in (POD_VOLUMES_DIR, POD_VOLUME_DEVICES_DIR):
        return describe_pod_volume(uid, kind, unescape_plugin_name(segs[3]), segs[4])
    if kind == POD_VOLUME_SUBPATHS_DIR:
        return LayoutPath(
            role=PathRole.POD_SUBPATH, plugin_name=None, volume_name=segs[3], pod_uid=uid
        )
    return None


def describe_pod_volume(uid: str, kind: str, plugin_name: str, volume_name: str) -> LayoutPath:
    """:func:`describe` of ``pods/<uid>/<kind>/<escaped plugin>/<volume>`` (``kind`` being
    ``volumes`` or ``volumeDevices``)."""
    vol_data_dir = None
    if plugin_name == CSI_PLUGIN_NAME:
        if kind == POD_VOLUMES_DIR:
            escaped = escape_plugin_name(CSI_PLUGIN_NAME)
            vol_data_dir = "/".join((PODS_DIR, uid, POD_VOLUMES_DIR, escaped, volume_name))
        else:
            vol_data_dir = _csi_block_data_rel(volume_name)
    return LayoutPath(
        role=PathRole.POD_VOLUME if kind == POD_VOLUMES_DIR else PathRole.BLOCK,
        plugin_name=plugin_name,
        volume_name=volume_name,
        pod_uid=uid,
        vol_data_dir=vol_data_dir,
    )


def _csi_block_data_rel(spec: str) -> str:
    return "/".join(
        (PLUGINS_DIR, CSI_PLUGIN_NAME, VOLUME_DEVICES_DIR, spec, CSI_BLOCK_DATA_DIR)
    )


@attrs.frozen(kw_only=True)
class PodPath:
    """A path under ``pods/``: ``<uid>/<kind>/<escaped plugin>/<volume>/...``."""

    pod_uid: str
    #: ``volumes``, ``volumeDevices``, ``plugins``, ``volume-subpaths``, ...
    kind: str
    #: The segments after the kind (the first is the escaped plugin for most kinds).
    rest: tuple[str, ...]


def split_pod_path(rel: str) -> PodPath | None:
    """``rel``, relative to the ``pods`` directory, split by the layout; None when it names
    no more than a pod."""
    segs = rel.split("/")
    if len(segs) < 2 or not segs[0]:
        return None
    return PodPath(pod_uid=segs[0], kind=segs[1], rest=tuple(segs[2:]))


def plugin_name_candidates(rel_segments: list[str]) -> list[str]:
    """Names of the plugins whose directory could hold ``plugins/<rel_segments...>``, the
    nested (``vendor/name``) one first."""
    out = []
    if len(rel_segments) >= 2:
        out.append(f"{rel_segments[0]}/{rel_segments[1]}")
    if rel_segments:
        out.append(rel_segments[0])
    return out


def block_segments(rel_segments: list[str]) -> list[str] | None:
    """The segments after ``volumeDevices`` of a path under ``plugins/``, when it is in a
    plugin's block layout (named by volume spec names), else None."""
    if VOLUME_DEVICES_DIR not in rel_segments:
        return None
    return rel_segments[rel_segments.index(VOLUME_DEVICES_DIR) + 1 :]


# --- containment ------------------------------------------------------------------------------


def relative_to(path: str, base: str) -> str | None:
    """``path`` relative to ``base`` (``""`` when equal), or None when it is not at or below
    ``base``, compared by whole segments (``/a/bc`` is not under ``/a/b``). Both are taken as
    given: resolve links first when that matters."""
    if path == base:
        return ""
    prefix = base if base.endswith("/") else base + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def real_below(path: str, root: str, real_root: str) -> str:
    """``path`` (absolute, normalised) with links resolved; at or below ``root`` (whose
    resolved path is ``real_root``) by that prefix alone, without looking at anything below
    the root: a path there may be the mount point of a dead server, where even an ``lstat``
    blocks, and the directories kubevol makes there are root's (0750), where nothing else
    places links."""
    rel = relative_to(path, root)
    if rel is None:
        return os.path.realpath(path)
    return f"{real_root}/{rel}" if rel else real_root


def is_within(path: str, base: str) -> bool:
    """Whether ``path`` is ``base`` or lies below it (by whole segments)."""
    return relative_to(path, base) is not None


def is_below(path: str, base: str) -> bool:
    """Whether ``path`` lies strictly below ``base`` (by whole segments)."""
    return bool(relative_to(path, base))


# --- directories the kubelet makes -------------------------------------------------------------

#: The kubelet's mode for the directories it owns: the root, ``pods``, ``plugins``, each
#: ``pods/<uid>`` and its ``volumes`` and ``plugins`` (``setupDataDirs``,
#: ``makePodDataDirs``). A pod's 0777 emptyDir and 0644 Secret files are private only
#: because of these parents.
DATA_DIR_MODE = 0o750


def make_data_dirs(root: str, *segments: str, mode: int = DATA_DIR_MODE) -> str:
    """Create ``root`` (mode 0750) and each missing directory of ``segments`` below it
    (``mode``), whatever the umask, and return the last one. Directories that exist keep
    their mode: they may be a kubelet's. A segment that is not a directory (a file, a link
    to nothing) fails with ``OSError`` as ``mkdir`` does; nothing is changed through a
    link planted between the ``mkdir`` and the ``chmod`` (the mode is set on a descriptor
    opened without following links)."""
    parent = os.path.dirname(root.rstrip("/")) or "/"
    os.makedirs(parent, exist_ok=True)
    path = root.rstrip("/") or "/"
    make_data_dir(path, DATA_DIR_MODE)
    for segment in segments:
        path = f"{path.rstrip('/')}/{validate_path_segment(segment, 'directory name')}"
        make_data_dir(path, mode)
    return path


def make_data_dir(path: str, mode: int = DATA_DIR_MODE) -> None:
    """Create directory ``path`` with ``mode`` whatever the umask, when missing (its parent
    must exist); an existing one keeps its mode (see :func:`make_data_dirs`)."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)  # mkdir's mode went through the umask
    finally:
        os.close(fd)


# --- durable atomic writes --------------------------------------------------------------------


def write_file_atomically(
    path: str, data: bytes, *, mode: int = 0o600, temp_prefix: str = ".tmp-"
) -> os.stat_result:
    """Replace ``path`` with ``data`` so that a crash leaves the old file or the new one,
    never a part: a temporary file in the same directory (named ``temp_prefix...``) is
    written, fsynced, given ``mode``, renamed over ``path``, and the directory is fsynced so
    that the rename itself survives a power loss.

    Returns the written file's status (the rename keeps its inode, size and times). The
    directory must exist. Raises ``OSError``; the temporary file is then removed and
    ``path`` is untouched.
    """
    directory = os.path.dirname(path) or "."
    fd = -1
    tmp = ""
    try:
        fd, tmp = _create_temp(directory, temp_prefix)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        if mode != 0o600:
            os.fchmod(fd, mode)
        written = os.fstat(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        tmp = ""
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    fsync_dir(directory)
    return written


def write_files_atomically(
    files: Sequence[tuple[str, bytes]], *, mode: int = 0o600, temp_prefix: str = ".tmp-"
) -> list[os.stat_result]:
    """:func:`write_file_atomically` for many files at once: every temporary file is
    written and fsynced, several at once (concurrent fsyncs share the filesystem journal's
    commits), then every file is renamed into place and each directory involved is fsynced
    once: faster than one ``syncfs`` of the filesystem (which also waits for every other
    writer's dirty data on it), and far faster than one file after another.

    A crash leaves each path with its old content or its new one, never a part (not
    necessarily all paths alike). Returns each written file's status, in order. Raises
    ``OSError``, once every temporary file was tried; temporary files not yet renamed are
    then removed.
    """
    #: Index in ``files`` -> its temporary file, until renamed.
    temps: dict[int, str] = {}

    def write_temp(i: int) -> os.stat_result:
        path, data = files[i]
        fd, temps[i] = _create_temp(os.path.dirname(path) or ".", temp_prefix)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode != 0o600:
                os.fchmod(fd, mode)
            os.fsync(fd)
            return os.fstat(fd)
        finally:
            os.close(fd)

    try:
        written = _on_threads(write_temp, range(len(files)))
        for i, (path, _) in enumerate(files):
            os.replace(temps[i], path)
            del temps[i]
    finally:
        for tmp in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    for directory in dict.fromkeys(os.path.dirname(path) or "." for path, _ in files):
        fsync_dir(directory)
    return written


def remove_files(paths: Iterable[str]) -> None:
    """Unlink ``paths`` (absent ones are fine), several at once: each unlink waits on the
    filesystem's journal, which a busy disk makes milliseconds, and the waits overlap.
    Raises the first ``OSError`` once every path was tried.
    """
    _on_threads(_remove_file, list(paths))


def _remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


#: File-system calls :func:`_on_threads` has in flight.
FILE_WORKERS = 8


def _on_threads(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``fn`` of every item on up to :data:`FILE_WORKERS` threads, results in order; every
    call has ended when it returns, or raises the first error (in order)."""
    if len(items) < 2:
        return [fn(item) for item in items]
    # Imported here: `import kubevol` does not need a thread pool.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(FILE_WORKERS, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
    return [future.result() for future in futures]


def _create_temp(directory: str, prefix: str) -> tuple[int, str]:
    """A new file (mode 0600) named ``<prefix><random>`` in ``directory``, opened for writing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(100):
        name = os.path.join(directory, prefix + os.urandom(6).hex())
        try:
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name in {directory}")


def fsync_dir(directory: str) -> None:
    """fsync ``directory``, so that entries created, renamed or removed in it are durable."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomically(path: str, document: object, *, mode: int = 0o600) -> os.stat_result:
    """:func:`write_file_atomically` of ``document`` as JSON (keys sorted, indented two spaces,
    a final newline). Raises ``OSError``, or ``TypeError``/``ValueError`` when ``document``
    is not JSON-serialisable (before anything is written)."""
    return write_file_atomically(path, json_document(document), mode=mode)


def json_document(document: object) -> bytes:
    """``document`` as the JSON files kubevol writes hold it (keys sorted, indented two
    spaces, a final newline). Raises ``TypeError``/``ValueError`` when not serialisable."""
    return (jsontext.dumps(document, indent=True, sort_keys=True) + "\n").encode()
