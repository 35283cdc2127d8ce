"""Pod records: under ``<root>/kubevol/pods/``, one file per pod that kubevol was asked to
run (``running``) or to stop (``terminating``), holding the manifests it came from.

The file is written before anything is mounted and removed only after everything is torn
down, so a crash at any point leaves enough on disk to finish the job. A record keeps the
ConfigMaps its pod reads but never a Secret (see :meth:`Manifests.objects_for`).
:class:`RecordWatcher` re-reads only the records that changed, for agents that poll them.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from kubevol.errors import KubevolError, SpecError
from kubevol.layout import (
    json_document,
    remove_files,
    validate_path_segment,
    write_files_atomically,
)
from kubevol.node.host import NodeVolumeHost
from kubevol.node.manifests import Manifests, manifest_pod_uid, manifests_from_objects, namespace_of
from kubevol.util.safeio import load_json_file

#: kubevol's own directory under the kubelet root.
STATE_DIR = "kubevol"


class RecordError(KubevolError, ValueError):
    """A pod record that cannot be read or does not hold what a record holds. Reported and
    skipped: one bad record never stops the commands on a root."""


class PodState(enum.StrEnum):
    """What kubevol was last asked to do with a recorded pod."""

    RUNNING = "running"
    TERMINATING = "terminating"


class Writer(enum.StrEnum):
    """Who recorded a pod. One owner never takes over or tears down the other's pod."""

    UP = "up"
    AGENT = "agent"
    #: A record written before kubevol said.
    UNSAID = ""


@attrs.frozen(kw_only=True)
class PodRecord:
    """A recorded pod: its UID, what was asked, and the manifests it came from."""

    uid: str
    state: PodState
    objects: tuple[dict[str, Any], ...]
    writer: Writer = Writer.UNSAID
    #: The objects as Manifests when they were checked already (a record read from disk).
    _parsed: Manifests | None = attrs.field(default=None, eq=False, repr=False, alias="parsed")

    @property
    def name(self) -> str:
        """``namespace/name`` of the pod, or its UID when the record has no manifest."""
        pod = next((o for o in self.objects if o.get("kind") == "Pod"), None)
        if pod is None:
            return self.uid
        return f"{namespace_of(pod)}/{(pod.get('metadata') or {}).get('name', '')}"

    def manifests(self) -> Manifests:
        """The record's objects as :class:`Manifests` (checked as manifest files are)."""
        if self._parsed is not None:
            return self._parsed
        return manifests_from_objects(self.objects, f"record of pod {self.uid}")

    def runs_for(self, writer: Writer) -> bool:
        """Whether the pod is running and ``writer`` recorded it."""
        return self.state is PodState.RUNNING and self.writer is writer


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

    def has(self, uid: str) -> bool:
        """Whether a record file of ``uid`` exists (one ``lstat``; nothing is read)."""
        return os.path.lexists(self._path(uid))

    def write(self, record: PodRecord) -> RecordStamp:
        """Create or replace the record of ``record.uid``; returns the stamp of the file
        written (what :class:`RecordWatcher` compares)."""
        return self.write_many([record])[0]

    def write_many(self, records: Sequence[PodRecord]) -> list[RecordStamp]:
        """:meth:`write` for many records at once: each atomic, all flushed to disk together
        (two flushes, not two per record: hundreds of pods are recorded in milliseconds,
        not seconds). Writing none creates nothing (a dry run leaves a root as it was)."""
        if not records:
            return []
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        files = [(self._path(r.uid), _encode(r)) for r in records]
        return [_stamp(st) for st in write_files_atomically(files)]

    def read(self, uid: str) -> PodRecord | None:
        """The record of pod ``uid``, or None. Raises :class:`RecordError` for a record that
        cannot be read (a FIFO, too large, not JSON...), does not hold a record of ``uid``
        or holds objects a manifest file could not (:func:`manifests_from_objects`)."""
        try:
            data = load_json_file(self._path(uid))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise RecordError(f"the record of pod {uid} is unreadable: {exc}") from exc
        return _record_of(uid, data)

    def scan(self) -> tuple[list[PodRecord], dict[str, str]]:
        """Every readable record sorted by UID, and why each other one is not (by UID)."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return [], {}
        out = []
        bad: dict[str, str] = {}
        for uid in _record_uids(names):
            try:
                record = self.read(uid)
            except RecordError as exc:
                bad[uid] = str(exc)
                continue
            if record is not None:
                out.append(record)
        return out, bad

    def all(self) -> list[PodRecord]:
        """Every readable record, sorted by UID (see :meth:`scan` for the others)."""
        return self.scan()[0]

    def remove(self, uid: str) -> None:
        """Forget pod ``uid``. Idempotent."""
        self.remove_many([uid])

    def remove_many(self, uids: Iterable[str]) -> None:
        """:meth:`remove` for many pods at once (several unlinks in flight, not one after
        another: see :func:`kubevol.layout.remove_files`)."""
        remove_files([self._path(uid) for uid in uids])


def _record_uids(names: Iterable[str]) -> list[str]:
    """The pod UIDs of the record files among directory entries ``names`` (temporary files
    of an interrupted write start with a dot and are not records)."""
    return [n[: -len(".json")] for n in names if n.endswith(".json") and not n.startswith(".")]


def _record_of(uid: str, data: object) -> PodRecord:
    """The record in document ``data`` of file ``<uid>.json``, checked field by field."""
    where = f"the record of pod {uid}"
    if not isinstance(data, dict):
        raise RecordError(f"{where} is not a JSON object")
    if data.get("uid") != uid:
        raise RecordError(f"{where} holds UID {data.get('uid')!r}, not its file's")
    try:
        state = PodState(str(data.get("state")))
    except ValueError as exc:
        raise RecordError(f"{where} has an unknown state {data.get('state')!r}") from exc
    objects = data.get("objects") or []
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise RecordError(f"{where}: objects must be a list of JSON objects")
    try:
        # Checked as manifest files are: an edited record must not bring a setuid mode or a
        # path out of the volume that the manifests could not.
        parsed = manifests_from_objects(objects, where)
    except SpecError as exc:
        raise RecordError(str(exc)) from exc
    try:
        writer = Writer(data.get("writer", ""))
    except ValueError as exc:
        raise RecordError(f"{where} has an unknown writer {data.get('writer')!r}") from exc
    return PodRecord(uid=uid, state=state, objects=tuple(objects), writer=writer, parsed=parsed)


def _encode(record: PodRecord) -> bytes:
    data = {"uid": record.uid, "state": record.state.value, "objects": list(record.objects)}
    if record.writer:
        data["writer"] = record.writer
    return json_document(data)


def records_for(
    manifests: Manifests, state: PodState, writer: Writer = Writer.UP
) -> list[PodRecord]:
    """One record per pod in ``manifests`` by ``writer``, each with the objects it refers
    to."""
    return [
        PodRecord(uid=manifest_pod_uid(p), state=state, objects=tuple(manifests.objects_for(p)),
                  writer=writer)
        for p in manifests.pods
    ]


class RecordWatcher:
    """Re-reads only the records that changed since the last :meth:`refresh` (by inode,
    size and modification time), for agents that poll the records."""

    def __init__(self, records: PodRecords) -> None:
        self.records = records
        self._cache: dict[str, tuple[RecordStamp, PodRecord]] = {}
        #: The records the last :meth:`refresh` could not read, with why (by UID): left out
        #: of what it returns, so their pods are left alone.
        self.unreadable: dict[str, str] = {}

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
        unreadable: dict[str, str] = {}
        for uid in _record_uids(names):
            try:
                st = os.stat(os.path.join(self.records.dir, uid + ".json"), follow_symlinks=False)
            except FileNotFoundError:
                continue
            stamp = _stamp(st)
            cached = self._cache.get(uid)
            if cached is not None and cached[0] == stamp:
                seen[uid] = cached
                continue
            try:
                record = self.records.read(uid)
            except RecordError as exc:
                unreadable[uid] = str(exc)
                continue
            if record is not None:
                seen[uid] = (stamp, record)
                changed.add(uid)
        changed |= set(self._cache) - set(seen)
        self._cache = seen
        self.unreadable = unreadable
        return {uid: r for uid, (_, r) in seen.items()}, changed
