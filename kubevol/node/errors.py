"""Errors of the node volume manager, under :class:`kubevol.errors.KubevolError`::

    KubevolError
    ├── OperationPendingError                 an operation on the same key is still running
    ├── OperationBackoffError                 the same operation failed and is backing off
    ├── VolumeInUseError                      pods on disk still use a volume; .users
    ├── ReconstructionError                   a volume on disk could not be rebuilt; .path
    └── PrivilegeError (PermissionError)      a privilege the command needs is missing

They live here until the lead moves them into ``kubevol/errors.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubevol.errors import KubevolError


class OperationPendingError(KubevolError):
    """An operation for this key (volume, pod, node) is already running (the kubelet's
    ``AlreadyExists``); ``key`` names it. Nothing was started."""

    def __init__(self, message: str, key: object) -> None:
        super().__init__(message)
        self.key = key


class OperationBackoffError(KubevolError):
    """The same operation failed on this key and may not be retried before ``retry_in``
    seconds; ``last_error`` is the failure that started the wait."""

    def __init__(
        self, message: str, key: object, retry_in: float, last_error: BaseException | None
    ) -> None:
        super().__init__(message)
        self.key = key
        self.retry_in = retry_in
        self.last_error = last_error


class VolumeInUseError(KubevolError):
    """A device is not unmounted or detached: pods still use it; ``users`` lists their
    mount paths as found on disk."""

    def __init__(self, message: str, users: Sequence[str]) -> None:
        super().__init__(message)
        self.users: tuple[str, ...] = tuple(users)


class ReconstructionError(KubevolError):
    """A volume found on disk could not be rebuilt; ``path`` is its directory."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class PrivilegeError(KubevolError, PermissionError):
    """The process lacks a privilege the command needs; the message says which and how to
    run it."""
