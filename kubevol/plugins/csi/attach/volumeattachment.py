"""Attach through VolumeAttachment objects, as Kubernetes does.

:meth:`VolumeAttachmentBackend.attach` creates ``csi-<sha256(handle+driver+node)>`` (an
existing one is reused) and polls it with the kubelet's backoff (0.5 s, x1.05, at most
7 s, 10 % jitter) until an external attacher sets ``status.attached``; a deletion, a
deletion timestamp or an ``attachError`` ends the wait with an error.
:meth:`~VolumeAttachmentBackend.detach` deletes it and waits until it is gone, failing on
a ``detachError``. The publish context is ``status.attachmentMetadata``.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kubevol.errors import KubevolError, OperationError
from kubevol.plugins.csi.attach.base import AttachBackend, AttachRequest, attachment_name
from kubevol.util.backoff import Backoff

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, StorageV1Api, V1VolumeAttachment

INITIAL_BACKOFF = 0.5
BACKOFF_FACTOR = 1.05
MAX_BACKOFF = 7.0
JITTER = 0.1


class VolumeAttachmentError(OperationError):
    """The VolumeAttachment reported an error, was deleted, or the wait timed out."""


class APIError(KubevolError):
    """The API server could not be reached or refused a request; ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class VolumeAttachmentBackend(AttachBackend):
    """Attachment through ``storage.k8s.io/v1`` VolumeAttachments.

    ``api_client`` is a ``kubernetes.client.ApiClient``; ``initial_backoff`` and
    ``max_backoff`` tune the polling (tests use shorter ones); ``sleep`` is injectable.
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api_client = api_client
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        self._api_lock = threading.Lock()
        self._api: StorageV1Api | None = None

    def _storage(self) -> StorageV1Api:
        with self._api_lock:
            if self._api is None:
                from kubernetes.client import StorageV1Api

                self._api = StorageV1Api(self.api_client)
            return self._api

    def _get(self, name: str) -> V1VolumeAttachment | None:
        """The VolumeAttachment ``name``, or None when it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._storage().read_volume_attachment(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise APIError(
                f"cannot get VolumeAttachment {name}: {exc.status} {exc.reason}", exc.status
            ) from exc
        except Exception as exc:
            raise APIError(f"cannot get VolumeAttachment {name}: {exc}") from exc

    def attaches(self, driver: str) -> bool:
        return True

    def attaches_known(self, driver: str) -> bool | None:
        return True

    def attach(self, request: AttachRequest, *, timeout: float) -> None:
        from kubernetes import client as k8s
        from kubernetes.client.exceptions import ApiException

        name = request.attachment_id
        if self._get(name) is None:
            body = k8s.V1VolumeAttachment(
                api_version="storage.k8s.io/v1",
                kind="VolumeAttachment",
                metadata=k8s.V1ObjectMeta(name=name),
                spec=k8s.V1VolumeAttachmentSpec(
                    attacher=request.driver,
                    node_name=request.node_name,
                    source=k8s.V1VolumeAttachmentSource(persistent_volume_name=request.pv_name),
                ),
            )
            try:
                self._storage().create_volume_attachment(body)
            except ApiException as exc:
                if exc.status != 409:  # AlreadyExists: someone created it meanwhile
                    raise APIError(
                        f"attacher.Attach failed: cannot create VolumeAttachment {name}: "
                        f"{exc.status} {exc.reason}",
                        exc.status,
                    ) from exc
            except Exception as exc:
                raise APIError(f"attacher.Attach failed: {exc}") from exc
        self._wait(
            driver=request.driver,
            volume_handle=request.volume_handle,
            name=name,
            timeout=timeout,
            verify=lambda va: _attach_status(va, request.volume_handle),
            operation="attach",
        )

    def wait_for_attach(self, request: AttachRequest) -> str:
        name = request.attachment_id
        va = self._get(name)
        if va is None:
            raise VolumeAttachmentError(
                f"volume {request.volume_handle} has GET error for volume attachment {name}: "
                f'volumeattachments.storage.k8s.io "{name}" not found'
            )
        if not _attach_status(va, request.volume_handle):
            raise VolumeAttachmentError(
                f"volume {request.volume_handle} is not attached for volume attachment {name}"
            )
        return name

    def is_attached(self, request: AttachRequest) -> bool:
        try:
            va = self._get(request.attachment_id)
        except APIError:
            return False
        return bool(va is not None and va.status is not None and va.status.attached)

    def publish_context(self, request: AttachRequest) -> dict[str, str]:
        name = request.attachment_id
        va = self._get(name)
        if va is None:
            raise VolumeAttachmentError(
                f'volumeattachments.storage.k8s.io "{name}" not found'
            )
        status = va.status
        return dict((status.attachment_metadata if status is not None else None) or {})

    def detach(self, driver: str, volume_handle: str, node_name: str, *, timeout: float) -> None:
        from kubernetes.client.exceptions import ApiException

        name = attachment_name(volume_handle, driver, node_name)
        try:
            self._storage().delete_volume_attachment(name)
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted, or never existed: detached
            raise APIError(
                f"detacher.Detach failed to delete VolumeAttachment [{name}]: "
                f"{exc.status} {exc.reason}",
                exc.status,
            ) from exc
        except Exception as exc:
            raise APIError(
                f"detacher.Detach failed to delete VolumeAttachment [{name}]: {exc}"
            ) from exc
        self._wait(
            driver=driver, volume_handle=volume_handle, name=name, timeout=timeout,
            verify=_detach_status, operation="detach",
        )

    def _wait(
        self,
        *,
        driver: str,
        volume_handle: str,
        name: str,
        timeout: float,
        verify: Callable[[V1VolumeAttachment | None], bool],
        operation: str,
    ) -> None:
        deadline = time.monotonic() + timeout
        backoff = Backoff(
            initial=self.initial_backoff, maximum=self.max_backoff, factor=BACKOFF_FACTOR
        )
        for attempt in itertools.count():
            delay = backoff.delay(attempt) * (1 + JITTER * random.random())
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._sleep(min(delay, remaining))
            if verify(self._get(name)):
                return
        raise VolumeAttachmentError(
            f"timed out waiting for external-attacher of {driver} CSI driver to "
            f"{operation} volume {volume_handle}"
        )


def _attach_status(va: V1VolumeAttachment | None, volume_handle: str) -> bool:
    if va is None:
        raise VolumeAttachmentError("volume attachment has been deleted")
    if va.metadata is not None and va.metadata.deletion_timestamp is not None:
        raise VolumeAttachmentError("volume attachment is being deleted")
    status = va.status
    if status is not None and status.attached:
        return True
    if status is not None and status.attach_error is not None:
        raise VolumeAttachmentError(status.attach_error.message or "attach failed")
    return False


def _detach_status(va: V1VolumeAttachment | None) -> bool:
    if va is None:
        return True
    status = va.status
    if status is not None and status.detach_error is not None:
        raise VolumeAttachmentError(status.detach_error.message or "detach failed")
    return False
