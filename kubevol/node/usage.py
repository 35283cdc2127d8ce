"""Which pods use a volume, read from disk rather than from memory.

A node agent that keeps its count of a volume's users only in memory loses it on restart
and may unmount a device that pods still use (Nomad issue 25813). Before a device is
unmounted or detached, kubevol asks the disk: every mount under ``pods/`` (from the kernel's
mount table) and every block device link under ``pods/*/volumeDevices/`` is traced back to
its pod volume directory and rebuilt with the plugin to learn its unique volume name.

Rebuilt names are cached per directory (keyed by its inode and modification time), so a
check costs one read of the mount table plus a ``stat`` per mounted pod volume.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from kubevol import layout
from kubevol.manager import VolumePluginMgr
from kubevol.mount.mountinfo import escape, parse_mountinfo_line
from kubevol.mount.table import MountTable
from kubevol.node.errors import ReconstructionError
from kubevol.node.host import NodeVolumeHost
from kubevol.node.poddirs import PodVolumeDir
from kubevol.node.reconstruct import ScanPass
from kubevol.node.state import VolumeMode

#: Parsed mountinfo lines (and rebuilt names) kept: a node's pod mounts, with room to spare.
_LINE_CACHE_SIZE = 65536

#: Pod volume directories that something uses: (pod UID, spec name, directory) -> the
#: mount points or device links in it.
_Candidates = dict[tuple[str, str, str], list[str]]
#: A mount in a pod volume directory: (escaped plugin name, the directory's key in
#: :data:`_Candidates`, mount point).
_PodMount = tuple[str, tuple[str, str, str], str]
_UNSEEN = ("", ("", "", ""), "")


class VolumeUsage:
    """Answers "which pod paths on disk still use volume X?". Thread-safe."""

    def __init__(self, host: NodeVolumeHost, mgr: VolumePluginMgr) -> None:
        self._host = host
        self._mgr = mgr
        #: Pod volume directory -> ((inode, mtime), unique name rebuilt from it).
        self._cache: dict[str, tuple[tuple[int, int], str | None]] = {}
        self._lines: dict[bytes, _PodMount | None] = {}
        #: The pod mounts of the last table asked about, by escaped plugin name: the
        #: checks of one tear-down (unstage, detach) share a table, and so its parse.
        self._grouped: tuple[bytes, dict[str, _Candidates]] = (b"", {})
        self._lock = threading.Lock()

    def table(self, *, superset: bool = False, at: str | None = None) -> MountTable:
        """The node's mount table, from its one owner: the host's mounter
        (:meth:`MountInterface.table <kubevol.mount.interface.MountInterface.table>`)."""
        return self._host.get_mounter().table(superset=superset, at=at)

    def users(
        self, unique_name: str, plugin_name: str, mode: VolumeMode,
        *, table: MountTable | None = None,
    ) -> list[str]:
        """Pod paths (mount points or device links) that use the volume, sorted, by
        ``table`` (None: :meth:`table`).

        Pod volumes that cannot be rebuilt are not counted here: the unstage guard's
        mount-reference check is what protects them.
        """
        pods_dir = self._host.real_pods_dir
        escaped = layout.escape_plugin_name(plugin_name)
        if mode is VolumeMode.BLOCK:
            candidates = self._block_candidates(pods_dir, escaped)
        else:
            candidates = self._mounted_candidates(pods_dir, table or self.table()).get(
                escaped, {})
        users = []
        names: ScanPass | None = None  # names only: no mount checks; made on a cache miss
        for (uid, spec_name, vol_dir), paths in candidates.items():
            try:
                st = os.lstat(vol_dir)
            except OSError:
                continue
            stamp = (st.st_ino, st.st_mtime_ns)
            cached = self._cache.get(vol_dir)  # a dict read needs no lock
            if cached is not None and cached[0] == stamp:
                name = cached[1]
            else:
                names = names or ScanPass(self._mgr)
                name = self._rebuilt_name(PodVolumeDir(
                    pod_uid=uid, plugin_name=plugin_name, spec_name=spec_name, path=vol_dir,
                    mode=mode,
                ), stamp, names)
            if name == unique_name:
                users.extend(paths)
        return sorted(users)

    def _mounted_candidates(self, pods_dir: str, table: MountTable) -> dict[str, _Candidates]:
        """Pod volume directories with something mounted in them, by escaped plugin name.

        Only lines that mention the pods directory are parsed, and each distinct line once:
        on a node with thousands of mounts, a check costs a substring search; and a table
        asked about again (the unstage's and the detach's checks) costs nothing.
        """
        data = table.data
        last, grouped = self._grouped
        if last is data:
            return grouped
        prefix = pods_dir + "/"
        derived = table.derived_from
        if derived is not None and derived[0].data is last:
            grouped = self._without(grouped, derived[1], prefix)
            self._grouped = (data, grouped)
            return grouped
        needle = os.fsencode(escape(prefix))
        grouped = {}
        for line in table.raw_lines_with(needle):
            found = self._lines.get(line, _UNSEEN)  # a dict read needs no lock
            if found is _UNSEEN:
                found = self._pod_mount(line, prefix)
            if found is None:
                continue
            escaped, directory, point = found
            grouped.setdefault(escaped, {}).setdefault(directory, []).append(point)
        self._grouped = (data, grouped)
        return grouped

    @staticmethod
    def _without(
        grouped: dict[str, _Candidates], points: Iterable[str], prefix: str
    ) -> dict[str, _Candidates]:
        """``grouped`` without the mount points ``points`` (copied where they were)."""
        out = dict(grouped)
        for point in points:
            found = _pod_mount_at(point, prefix)
            if found is None or (directories := out.get(found[0])) is None:
                continue
            if (left := directories.get(found[1])) is None or point not in left:
                continue
            directories = out[found[0]] = dict(directories)
            if left := [p for p in left if p != point]:
                directories[found[1]] = left
            else:
                del directories[found[1]]
                if not directories:
                    del out[found[0]]
        return out

    def _pod_mount(self, line: bytes, prefix: str) -> _PodMount | None:
        """:func:`_pod_mount_at` of one mountinfo line's mount point (cached by the line's
        bytes)."""
        found = _pod_mount_at(parse_mountinfo_line(os.fsdecode(line)).mount_point, prefix)
        with self._lock:
            if len(self._lines) > _LINE_CACHE_SIZE:
                self._lines.clear()
            self._lines[line] = found
        return found

    @staticmethod
    def _block_candidates(pods_dir: str, escaped: str) -> _Candidates:
        out: _Candidates = {}
        try:
            uids = os.listdir(pods_dir)
        except FileNotFoundError:
            return out
        for uid in uids:
            plugin_dir = os.path.join(pods_dir, uid, layout.POD_VOLUME_DEVICES_DIR, escaped)
            try:
                names = os.listdir(plugin_dir)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                link = os.path.join(plugin_dir, name)
                out[(uid, name, link)] = [link]
        return out

    def _rebuilt_name(
        self, d: PodVolumeDir, stamp: tuple[int, int], names: ScanPass
    ) -> str | None:
        """The unique name the plugin rebuilds from ``d`` (None: it cannot), cached under
        the directory's ``stamp`` (inode and modification time)."""
        try:
            name: str | None = names.reconstruct(d).unique_name
        except ReconstructionError:
            name = None
        with self._lock:
            if len(self._cache) > _LINE_CACHE_SIZE:
                self._cache.clear()
            self._cache[d.path] = (stamp, name)
        return name


def _pod_mount_at(point: str, prefix: str) -> _PodMount | None:
    """(escaped plugin, (pod UID, spec name, volume directory), mount point) of a mount
    point under a pod's ``volumes`` directory (``prefix``: the pods directory and a slash);
    None for any other."""
    pod = layout.split_pod_path(point[len(prefix) :]) if point.startswith(prefix) else None
    if pod is None or pod.kind != layout.POD_VOLUMES_DIR or len(pod.rest) < 2:
        return None
    escaped, spec_name = pod.rest[0], pod.rest[1]
    vol_dir = os.path.join(prefix, pod.pod_uid, layout.POD_VOLUMES_DIR, escaped, spec_name)
    return escaped, (pod.pod_uid, spec_name, vol_dir), point
