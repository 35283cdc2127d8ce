"""Context-manager behaviour shared by kubevol's long-lived objects (clients, servers,
drivers, caches), so each class states only what it closes or starts."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Self

#: A hook a lower layer runs around a wait it does not control (a helper process, a remote
#: call), so that the layer that made it can act meanwhile: ``with around(): wait()``.
#: ``contextlib.nullcontext`` when nobody asked for one.
Around = Callable[[], AbstractContextManager[object]]


class ClosesOnExit:
    """``with obj:`` binds ``obj`` and calls ``obj.close()`` on the way out."""

    def close(self) -> None:
        """Release what the object holds. Idempotent."""
        raise NotImplementedError(f"{type(self).__name__} must define close()")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RunsWhileEntered:
    """``with obj:`` calls ``obj.start()`` (binding what it returns) and ``obj.stop()`` on
    the way out."""

    def start(self) -> Self:
        """Start; returns the object itself."""
        raise NotImplementedError(f"{type(self).__name__} must define start()")

    def stop(self) -> None:
        """Stop. Idempotent."""
        raise NotImplementedError(f"{type(self).__name__} must define stop()")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
