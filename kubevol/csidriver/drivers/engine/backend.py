"""The storage side of a bundled driver: what differs between the mock and the hostpath driver.

The services decide *whether* an RPC may proceed (existence, compatibility, idempotency,
capacity) and record the result; a :class:`VolumeBackend` only does the work on storage
and on the node. Backend methods run under the volume's lock, one call per volume at a time,
and must tolerate being repeated after a crash (a half-created volume, a mount that exists
though the state does not say so). Failures raise
:class:`~kubevol.csi.errors.CSIRPCError` with the status the caller should see; any other
exception answers INTERNAL.
"""

from __future__ import annotations

import abc
import os

from kubevol.csi import types as t
from kubevol.csidriver.drivers.engine.records import (
    Publication,
    SnapshotRecord,
    Staging,
    VolumeRecord,
)

#: What a new volume is filled from: a snapshot, another volume, or nothing.
Source = SnapshotRecord | VolumeRecord | None


class VolumeBackend(abc.ABC):
    """Creates, copies and mounts volumes for the engine's services."""

    # --- controller -----------------------------------------------------------------

    @abc.abstractmethod
    def create_volume(self, volume: VolumeRecord, source: Source) -> None:
        """Make storage for ``volume``, filled from ``source``. Idempotent."""

    @abc.abstractmethod
    def delete_volume(self, volume: VolumeRecord) -> None:
        """Remove the volume's storage. Idempotent: missing storage is success."""

    @abc.abstractmethod
    def expand_volume(self, volume: VolumeRecord, new_size: int) -> bool:
        """Grow the storage to ``new_size`` bytes; True when the node must expand too."""

    @abc.abstractmethod
    def create_snapshot(self, snapshot: SnapshotRecord, volume: VolumeRecord) -> None:
        """Copy ``volume`` into ``snapshot``'s storage. Idempotent."""

    @abc.abstractmethod
    def delete_snapshot(self, snapshot: SnapshotRecord) -> None:
        """Remove the snapshot's storage. Idempotent."""

    @abc.abstractmethod
    def volume_condition(self, volume: VolumeRecord) -> t.VolumeCondition:
        """Whether the volume's storage is healthy, as the controller sees it."""

    # --- node -----------------------------------------------------------------------

    @abc.abstractmethod
    def stage(self, volume: VolumeRecord, staging: Staging, *, repeat: bool) -> Staging:
        """Stage at ``staging.path``; returns the record to keep (with the device it used).

        The engine records the staging before calling, so a crash leaves a record of what
        may have been done. ``repeat`` is True when that record existed before this call
        (a repeated or resumed NodeStage): what this driver finds at the path is its own
        and is reused. When False, a mount already at the path is someone else's and must
        be refused (FAILED_PRECONDITION), never adopted.
        """

    @abc.abstractmethod
    def unstage(self, volume: VolumeRecord, staging: Staging) -> None:
        """Undo :meth:`stage`; the staging directory itself stays (the CO owns it)."""

    @abc.abstractmethod
    def publish(
        self,
        volume: VolumeRecord,
        publication: Publication,
        staging: Staging | None,
        *,
        repeat: bool,
    ) -> None:
        """Make the volume visible at ``publication.target_path``, which the driver creates
        (a directory for mount access, a file for block).

        The engine records the publication before calling. ``repeat`` is True when the
        record existed before this call: the target, if there, is the driver's own. When
        False, anything already at the target was made by someone else: refuse it
        (FAILED_PRECONDITION) rather than mount over it or later delete it.
        """

    @abc.abstractmethod
    def unpublish(self, volume: VolumeRecord, publication: Publication) -> None:
        """Undo :meth:`publish` and remove the target path the driver created. Idempotent."""

    def stage_leftover(self, volume: VolumeRecord, staging: Staging) -> bool:
        """Whether a failed :meth:`stage` left something that a later NodeUnstage must undo
        (the engine then keeps the staging record instead of dropping it)."""
        return False

    def publish_leftover(self, volume: VolumeRecord, publication: Publication) -> bool:
        """Whether a failed :meth:`publish` left its target behind for NodeUnpublish to
        remove (the engine then keeps the publication record instead of dropping it)."""
        return os.path.lexists(publication.target_path)

    @abc.abstractmethod
    def volume_stats(self, volume: VolumeRecord, path: str) -> t.VolumeStats:
        """Usage and condition of the volume as seen at ``path`` (a target or staging path)."""

    @abc.abstractmethod
    def node_expand(self, volume: VolumeRecord, path: str) -> int:
        """Make the node see the volume's new size at ``path``; returns the size in bytes."""

    def health_problem(self) -> str | None:
        """Why the backend cannot serve now (Probe answers FAILED_PRECONDITION), or None."""
        return None

    def close(self) -> None:  # noqa: B027  # optional hook: most backends hold nothing
        """Release what the backend holds while the driver stops (not volumes in use)."""
