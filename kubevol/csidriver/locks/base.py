"""The contract every serial-volume-access lock provider fulfils.

The serial-volume interceptor of the driver framework takes one lock per volume id
(ControllerPublish/Unpublish, DeleteVolume, NodePublish/Unpublish) or per volume name
(CreateVolume) around each call, and answers ABORTED when :meth:`VolumeLockProvider.acquire`
returns ``None``. Providers differ only in how far the exclusion reaches: one process
(:class:`~kubevol.csidriver.locks.inprocess.InProcessLockProvider`) or every process that talks
to the same etcd cluster (:class:`~kubevol.csidriver.locks.etcd.EtcdLockProvider`).
"""

from __future__ import annotations

import abc
import enum
from types import TracebackType

from kubevol.errors import KubevolError
from kubevol.util.lifecycle import ClosesOnExit


class LockProviderError(KubevolError):
    """The lock backend failed (etcd unreachable or answering an error); contention is not this."""


class LockConfigError(KubevolError, ValueError):
    """A lock provider setting or lock key is malformed; the message names the setting."""


class LockKind(enum.Enum):
    """What a lock key identifies; the value is the key segment gocsi uses in etcd."""

    BY_ID = "volumesByID"
    BY_NAME = "volumesByName"


def check_lock_key(kind: LockKind, key: str) -> None:
    """Raise :class:`LockConfigError` unless ``key`` can name a ``kind`` lock.

    Every non-empty string without NUL is accepted as is: providers never clean or split
    the key, so two distinct volume ids can never share a lock.
    """
    if not isinstance(kind, LockKind):
        raise LockConfigError(f"lock kind must be a LockKind, not {kind!r}")
    if not key:
        raise LockConfigError(f"{kind.value} lock key must not be empty")
    if "\0" in key:
        raise LockConfigError(f"{kind.value} lock key {key!r} contains a NUL character")


class HeldLock(abc.ABC):
    """A lock that was acquired and is held until :meth:`release`.

    Usable as a context manager that releases on exit.
    """

    @abc.abstractmethod
    def release(self) -> None:
        """Give the lock up. Idempotent: later calls do nothing. Never raises."""

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class VolumeLockProvider(ClosesOnExit, abc.ABC):
    """Hands out exclusive, non-reentrant locks keyed by (:class:`LockKind`, key).

    Locks of different kinds never conflict, even for equal keys. A holder asking again for
    a lock it already holds waits like anyone else. Thread-safe.
    """

    @abc.abstractmethod
    def acquire(self, kind: LockKind, key: str, timeout: float) -> HeldLock | None:
        """Try to take the lock for (kind, key), waiting up to ``timeout`` seconds (0 = try once).

        Returns None if still held by someone else when the timeout passes. Raises
        :class:`LockConfigError` for an empty key or negative timeout and
        :class:`LockProviderError` if the backend cannot be asked.
        """

    def close(self) -> None:
        """Release the provider's resources (leases, sessions, threads). Idempotent.

        Whether locks still held are released is up to the provider (the etcd one releases
        them). The provider must not be used afterwards.
        """


def check_timeout(timeout: float) -> float:
    """Return ``timeout`` as a float, raising :class:`LockConfigError` if negative or NaN."""
    value = float(timeout)
    if not value >= 0:  # also catches NaN
        raise LockConfigError(f"lock timeout must be >= 0 seconds, got {timeout!r}")
    return value
