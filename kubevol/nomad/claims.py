"""Which allocations use which staged volume (Nomad's ``volumeUsageTracker``), persisted.

A volume is claimed for an allocation *before* it is staged, and freed only after that
allocation's unpublish succeeded; the volume is unstaged when the last claim goes. Nomad
keeps these claims in memory only, so a restarted agent forgets them and unstages volumes
other allocations still use (hashicorp/nomad#25813). Here every change is written to a
state file atomically before it takes effect, and :meth:`UsageTracker.rebuild_from_mounts`
adds a claim for every per-allocation target still mounted, so a lost or stale file errs on
the side of keeping a volume staged.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import attrs

from kubevol.nomad._state import read_state, write_state
from kubevol.nomad.errors import ManagerStateError
from kubevol.nomad.types import UsageOptions

log = logging.getLogger(__name__)

_STATE_KIND = "csi-volume-usage"

#: Directory names under a plugin's mount root.
STAGING_DIR_NAME = "staging"
ALLOC_DIR_NAME = "per-alloc"
#: Namespace of volumes that name none.
DEFAULT_NAMESPACE = "default"


@attrs.frozen(kw_only=True, order=True)
class VolumeKey:
    """A volume in one usage: the unit that is staged once and shared by allocations.

    ``usage`` is :meth:`UsageOptions.to_fs` (mount options are deliberately not part of it).
    """

    namespace: str
    volume_id: str
    usage: str


class UsageTracker:
    """Claims of allocations on volumes. Thread-safe.

    With ``state_path`` the claims are loaded on construction (raising
    :class:`~kubevol.nomad.errors.ManagerStateError` when unreadable) and written
    after each change; a change whose write fails is undone and the error raised, so
    memory and disk never disagree.
    """

    def __init__(self, state_path: str | None = None) -> None:
        self.state_path = state_path
        self._lock = threading.Lock()
        self._users: dict[VolumeKey, set[str]] = {}
        self._remote_ids: dict[VolumeKey, str] = {}
        if state_path is not None:
            self._load(state_path)

    def _load(self, path: str) -> None:
        data = read_state(path, _STATE_KIND)
        if data is None:
            return
        try:
            if not isinstance(data, dict):
                raise TypeError(f"the state is a {type(data).__name__}, not an object")
            for item in data["claims"]:
                key = VolumeKey(
                    namespace=str(item["namespace"]),
                    volume_id=str(item["volume_id"]),
                    usage=str(item["usage"]),
                )
                self._users[key] = {str(a) for a in item["allocs"]}
                if item.get("remote_id"):
                    self._remote_ids[key] = str(item["remote_id"])
        except (KeyError, TypeError) as exc:
            raise ManagerStateError(f"malformed volume usage state in {path!r}: {exc}") from exc

    def _persist(self) -> None:
        if self.state_path is None:
            return
        claims = [
            {
                "namespace": key.namespace,
                "volume_id": key.volume_id,
                "usage": key.usage,
                "remote_id": self._remote_ids.get(key, ""),
                "allocs": sorted(users),
            }
            for key, users in sorted(self._users.items())
        ]
        write_state(self.state_path, _STATE_KIND, {"claims": claims})

    def _change(self, key: VolumeKey, users: set[str], remote_id: str | None) -> None:
        """Apply ``users`` for ``key`` and persist; undo and raise if persisting fails."""
        old_users = self._users.get(key)
        old_remote = self._remote_ids.get(key)
        if users:
            self._users[key] = users
            if remote_id:
                self._remote_ids[key] = remote_id
        else:
            self._users.pop(key, None)
            self._remote_ids.pop(key, None)
        try:
            self._persist()
        except ManagerStateError:
            if old_users is None:
                self._users.pop(key, None)
            else:
                self._users[key] = old_users
            if old_remote is None:
                self._remote_ids.pop(key, None)
            else:
                self._remote_ids[key] = old_remote
            raise

    def claim(self, alloc_id: str, key: VolumeKey, remote_id: str = "") -> bool:
        """Record that ``alloc_id`` uses ``key``; True when the claim is new. Idempotent."""
        with self._lock:
            users = set(self._users.get(key, ()))
            if alloc_id in users:
                return False
            users.add(alloc_id)
            self._change(key, users, remote_id)
            return True

    def free(self, alloc_id: str, key: VolumeKey) -> bool:
        """Drop ``alloc_id``'s claim on ``key``; True when nobody uses ``key`` any more
        (also when ``alloc_id`` held no claim). Idempotent."""
        with self._lock:
            users = set(self._users.get(key, ()))
            if alloc_id in users:
                users.discard(alloc_id)
                self._change(key, users, None)
            return not users

    def users(self, key: VolumeKey) -> frozenset[str]:
        """The allocations that claim ``key``."""
        with self._lock:
            return frozenset(self._users.get(key, ()))

    def remote_id(self, key: VolumeKey) -> str:
        """The plugin's id of the volume as given at claim time (``key.volume_id`` if none)."""
        with self._lock:
            return self._remote_ids.get(key) or key.volume_id

    def claims(self) -> dict[VolumeKey, frozenset[str]]:
        """Every claimed key with its allocations."""
        with self._lock:
            return {key: frozenset(users) for key, users in self._users.items()}

    def rebuild_from_mounts(self, mount_root: str, is_mount_point: Callable[[str], bool]) -> int:
        """Claim every ``per-alloc/<alloc>/<volume>/<usage>`` under ``mount_root`` that is
        a mount point; returns how many claims were added.

        The per-allocation path carries no namespace: the volume is claimed in every
        namespace under ``staging/`` that has ``<volume>/<usage>`` staged, or in
        :data:`DEFAULT_NAMESPACE` when none has. Claiming too much only keeps a volume
        staged longer; claiming too little would unstage it under a running allocation.
        """
        added = 0
        alloc_root = os.path.join(mount_root, ALLOC_DIR_NAME)
        for alloc_id in _subdirs(alloc_root):
            for volume_id in _subdirs(os.path.join(alloc_root, alloc_id)):
                volume_dir = os.path.join(alloc_root, alloc_id, volume_id)
                for usage in _entries(volume_dir):
                    try:
                        UsageOptions.from_fs(usage)
                    except ValueError:
                        continue
                    if not is_mount_point(os.path.join(volume_dir, usage)):
                        continue
                    for namespace in _staged_namespaces(mount_root, volume_id, usage):
                        key = VolumeKey(namespace=namespace, volume_id=volume_id, usage=usage)
                        if self.claim(alloc_id, key):
                            log.info("restored claim of %s on %s from its mount", alloc_id, key)
                            added += 1
        return added


def _entries(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _subdirs(path: str) -> list[str]:
    return [n for n in _entries(path) if os.path.isdir(os.path.join(path, n))]


def _staged_namespaces(mount_root: str, volume_id: str, usage: str) -> list[str]:
    staging = os.path.join(mount_root, STAGING_DIR_NAME)
    found = [
        ns
        for ns in _subdirs(staging)
        if os.path.lexists(os.path.join(staging, ns, volume_id, usage))
    ]
    return found or [DEFAULT_NAMESPACE]
