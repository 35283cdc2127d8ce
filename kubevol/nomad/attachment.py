"""Waiting for a volume to be attached to this node before mounting it (Nomad's
``AttachmentWaiter``, a TODO there).

When the controller publish happens elsewhere (a Nomad-like server calls
ControllerPublishVolume and keeps the publish context in the volume's claim, or an external
attacher does it), the node agent must wait until the publish context of (volume, node)
exists, then hand it to :meth:`~kubevol.nomad.VolumeManager.mount_volume`::

    records = AttachmentRecords()                 # in-process; AttachmentDirectory across
                                                  # processes; or the agent's own source
    waiter = manager.attachment_waiter(records)   # the mount action's timeout, cancelled
    context = waiter.wait_for_attachment(volume, node_id)   # on manager shutdown
    mounter.mount_volume(volume, alloc_id, usage, publish_context=context)

The source is asked again after each backoff delay (10 ms doubling to 250 ms), so a
cancellation is seen at once and a new attachment within a quarter second.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping

from kubevol.layout import validate_path_segment
from kubevol.nomad._state import read_state, write_state
from kubevol.nomad.errors import (
    AttachmentCancelledError,
    AttachmentTimeoutError,
    ManagerStateError,
)
from kubevol.nomad.types import CSIVolume
from kubevol.util.backoff import Backoff

log = logging.getLogger(__name__)

#: How often a waiter asks its source again.
ATTACHMENT_POLL = Backoff(initial=0.01, maximum=0.25)
#: Default time a waiter waits (seconds): the mount action's timeout.
DEFAULT_ATTACHMENT_TIMEOUT = 120.0


class AttachmentSource(abc.ABC):
    """Where publish contexts come from: the agent's view of the server's claims, an
    external attacher's records, or :class:`AttachmentRecords`."""

    @abc.abstractmethod
    def publish_context(
        self, namespace: str, volume_id: str, node_id: str
    ) -> Mapping[str, str] | None:
        """The publish context of the volume on ``node_id``, or None while it is not
        attached there (an empty mapping is an attachment without context). Must not
        block for long: it is asked repeatedly."""


class AttachmentRecords(AttachmentSource):
    """Attachments kept in memory, recorded by whoever published the volume. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contexts: dict[tuple[str, str, str], dict[str, str]] = {}

    def record(
        self,
        volume: CSIVolume,
        node_id: str,
        publish_context: Mapping[str, str] | None = None,
    ) -> None:
        """Record that ``volume`` is attached to ``node_id`` with ``publish_context``."""
        validate_path_segment(node_id, "node id")
        with self._lock:
            self._contexts[(volume.namespace, volume.id, node_id)] = dict(publish_context or {})

    def forget(self, volume: CSIVolume, node_id: str) -> None:
        """Record that ``volume`` is detached from ``node_id``. Idempotent."""
        with self._lock:
            self._contexts.pop((volume.namespace, volume.id, node_id), None)

    def publish_context(
        self, namespace: str, volume_id: str, node_id: str
    ) -> Mapping[str, str] | None:
        with self._lock:
            found = self._contexts.get((namespace, volume_id, node_id))
            return None if found is None else dict(found)


class AttachmentDirectory(AttachmentSource):
    """Attachments as files ``<path>/<namespace>/<volume>/<node>.json`` (mode 0600, written
    atomically), for an attacher in another process: it calls :meth:`record` after its
    ControllerPublishVolume, the agent's waiter reads. Names are validated path segments.
    """

    _KIND = "csi-attachment"

    def __init__(self, path: str) -> None:
        self.path = path

    def _file(self, namespace: str, volume_id: str, node_id: str) -> str:
        return os.path.join(
            self.path,
            validate_path_segment(namespace, "volume namespace"),
            validate_path_segment(volume_id, "volume id"),
            validate_path_segment(node_id, "node id") + ".json",
        )

    def record(
        self,
        volume: CSIVolume,
        node_id: str,
        publish_context: Mapping[str, str] | None = None,
    ) -> None:
        """Record that ``volume`` is attached to ``node_id`` with ``publish_context``.
        Raises :class:`~kubevol.nomad.errors.ManagerStateError` when it cannot be written."""
        path = self._file(volume.namespace, volume.id, node_id)
        write_state(path, self._KIND, {"publish_context": dict(publish_context or {})})

    def forget(self, volume: CSIVolume, node_id: str) -> None:
        """Record that ``volume`` is detached from ``node_id``. Idempotent."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file(volume.namespace, volume.id, node_id))

    def publish_context(
        self, namespace: str, volume_id: str, node_id: str
    ) -> Mapping[str, str] | None:
        """The recorded context; raises :class:`~kubevol.nomad.errors.ManagerStateError`
        for a file that is not a recorded attachment (hostile input is refused)."""
        path = self._file(namespace, volume_id, node_id)
        data = read_state(path, self._KIND)
        if data is None:
            return None
        context = data.get("publish_context") if isinstance(data, dict) else None
        if not isinstance(context, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in context.items()
        ):
            raise ManagerStateError(f"{path!r} holds no publish context")
        return dict(context)


class AttachmentWaiter:
    """Waits for publish contexts to appear in ``source``. Thread-safe.

    ``timeout`` is the default wait (seconds); ``cancel``, when set, ends every wait of
    this waiter (a manager passes its shutdown event).
    """

    def __init__(
        self,
        source: AttachmentSource,
        *,
        timeout: float = DEFAULT_ATTACHMENT_TIMEOUT,
        cancel: threading.Event | None = None,
        poll: Backoff = ATTACHMENT_POLL,
        logger: logging.Logger | None = None,
    ) -> None:
        self.source = source
        self.timeout = timeout
        self._cancel = cancel if cancel is not None else threading.Event()
        self._poll = poll
        self._log = logger if logger is not None else log

    def wait_for_attachment(
        self,
        volume: CSIVolume,
        node_id: str,
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, str]:
        """The publish context of ``volume`` on ``node_id``, once the source has it.

        Raises :class:`~kubevol.nomad.errors.AttachmentTimeoutError` after ``timeout``
        seconds (default: the waiter's), :class:`~kubevol.nomad.errors.AttachmentCancelledError`
        as soon as ``cancel`` or the waiter's own cancel event is set. An error of the
        source is raised as it comes.
        """
        validate_path_segment(node_id, "node id")
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        events = [self._cancel] if cancel is None else [cancel, self._cancel]
        what = f"volume {volume.namespace}/{volume.id} on node {node_id}"
        attempt = 0
        while True:
            if any(e.is_set() for e in events):
                raise AttachmentCancelledError(f"waiting for the attachment of {what} cancelled")
            found = self.source.publish_context(volume.namespace, volume.id, node_id)
            if found is not None:
                self._log.debug("%s is attached (after %d checks)", what, attempt + 1)
                return dict(found)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AttachmentTimeoutError(f"{what} was not attached within {budget:g}s")
            # Wait on the first event; a second one (the waiter's) is seen at the next
            # check, at most one poll delay later.
            events[0].wait(min(self._poll.delay(attempt), remaining))
            attempt += 1
