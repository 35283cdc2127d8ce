"""Pod records: under ``<root>/kubevol/pods/``, one file per pod that kubevol was asked to
run (``running``) or to stop (``terminating``), holding the manifests it came from.

The file is written before anything is mounted and removed only after everything is torn
down, so a crash at any point leaves enough on disk to finish the job. A record keeps the
ConfigMaps its pod reads but never a Secret (see :meth:`Manifests.objects_for`).
:class:`RecordWatcher` re-reads only the records that changed, for agents that poll them.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Sequence
from typing import Any

import attrs

from kubevol.errors import KubevolError
from kubevol.layout import validate_path_segment, write_json_atomically
from kubevol.node.host import NodeVolumeHost
from kubevol.node.manifests import Manifests, manifest_pod_uid, manifests_from_objects, namespace_of

#: kubevol's own directory under the kubelet root.
STATE_DIR = "kubevol"


class PodState(enum.StrEnum):
    """What kubevol was last asked to do with a recorded pod."""

    RUNNING = "running"
    TERMINATING = "terminating"


@attrs.frozen(kw_only=True)
class PodRecord:
    """A recorded pod: its UID, what was asked, and the manifests it came from."""

    uid: str
    state: PodState
    objects: tuple[dict[str, Any], ...]

    @property
    def name(self) -> str:
        """``namespace/name`` of the pod, or its UID when the record has no manifest."""
        pod = next((o for o in self.objects if o.get("kind") == "Pod"), None)
        if pod is None:
            return self.uid
        return f"{namespace_of(pod)}/{(pod.get('metadata') or {}).get('name', '')}"

    def manifests(self) -> Manifests:
        """The record's objects as :class:`Manifests` (checked as manifest files are)."""
        return manifests_from_objects(self.objects, f"record of pod {self.uid}")


#: What identifies one version of a record file: inode, size, modification time (ns).
RecordStamp = tuple[int, int, int]


def _stamp(st: os.stat_result) -> RecordStamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class PodRecords:
    """The pods kubevol runs on a root, one JSON file each under ``<root>/kubevol/pods/``.

    Writes are atomic (temporary file, ``fsync``, ``rename``), so a crash leaves either the
    old or the new record.
    """

    def __init__(self, host: NodeVolumeHost) -> None:
        self.dir = os.path.join(host.root_dir, STATE_DIR, "pods")

    def _path(self, uid: str) -> str:
        return os.path.join(self.dir, validate_path_segment(uid, "pod UID") + ".json")

    def write(self, record: PodRecord) -> RecordStamp:
        """Create or replace the record of ``record.uid``; returns the stamp of the file
        written (what :class:`RecordWatcher` compares)."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        data = {"uid": record.uid, "state": record.state.value, "objects": list(record.objects)}
        # The renamed file keeps its inode, size and modification time.
        return _stamp(write_json_atomically(self._path(record.uid), data))

    def read(self, uid: str) -> PodRecord | None:
        """The record of pod ``uid``, or None."""
        try:
            with open(self._path(uid), encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise KubevolError(f"the record of pod {uid} is unreadable: {exc}") from exc
        return PodRecord(
            uid=str(data["uid"]),
            state=PodState(data["state"]),
            objects=tuple(data.get("objects") or ()),
        )

    def all(self) -> list[PodRecord]:
        """Every record, sorted by UID (unreadable ones raise)."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                record = self.read(name[: -len(".json")])
                if record is not None:
                    out.append(record)
        return out

    def remove(self, uid: str) -> None:
        """Forget pod ``uid``. Idempotent."""
        try:
            os.unlink(self._path(uid))
        except FileNotFoundError:
            return


def records_for(manifests: Manifests, state: PodState) -> list[PodRecord]:
    """One record per pod in ``manifests``, each with the objects it refers to."""
    return [
        PodRecord(uid=manifest_pod_uid(p), state=state, objects=tuple(manifests.objects_for(p)))
        for p in manifests.pods
    ]


def describe_pods(records: Sequence[PodRecord]) -> dict[str, str]:
    """UID → ``namespace/name`` of recorded pods."""
    return {r.uid: r.name for r in records}


class RecordWatcher:
    """Re-reads only the records that changed since the last :meth:`refresh` (by inode,
    size and modification time), for agents that poll the records."""

    def __init__(self, records: PodRecords) -> None:
        self.records = records
        self._cache: dict[str, tuple[RecordStamp, PodRecord]] = {}

    def note(self, record: PodRecord, stamp: RecordStamp) -> None:
        """Know ``record`` as the content of its file at ``stamp`` (its writer's own
        :meth:`PodRecords.write`): the next :meth:`refresh` does not read it back, nor
        report it changed, unless the file changed since."""
        self._cache[record.uid] = (stamp, record)

    def refresh(self) -> tuple[dict[str, PodRecord], set[str]]:
        """All records by UID, and the UIDs whose record appeared, changed or went."""
        try:
            names = os.listdir(self.records.dir)
        except FileNotFoundError:
            names = []
        seen: dict[str, tuple[RecordStamp, PodRecord]] = {}
        changed: set[str] = set()
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            uid = name[: -len(".json")]
            try:
                st = os.stat(os.path.join(self.records.dir, name))
            except FileNotFoundError:
                continue
            stamp = _stamp(st)
            cached = self._cache.get(uid)
            if cached is not None and cached[0] == stamp:
                seen[uid] = cached
                continue
            record = self.records.read(uid)
            if record is not None:
                seen[uid] = (stamp, record)
                changed.add(uid)
        changed |= set(self._cache) - set(seen)
        self._cache = seen
        return {uid: r for uid, (_, r) in seen.items()}, changed
