"""What cleaning up a volume that reconstruction could not rebuild (or an orphan device
mount) did: a kind that code branches on, and a detail for people."""

from __future__ import annotations

import enum

import attrs


class CleanupKind(enum.Enum):
    """How a clean-up ended."""

    #: Nothing was tried yet (a read-only scan).
    NOT_TRIED = "not-tried"
    CLEANED = "cleaned"
    #: Deliberately not cleaned (``detail`` says why); it may be cleaned later.
    LEFT = "left"
    #: Tried and failed (``detail`` has the error); what was there is left in place.
    FAILED = "failed"


@attrs.frozen
class Cleanup:
    """The outcome of one clean-up. ``str()`` gives the form reports show: ``""``,
    ``cleaned``, ``left: <why>`` or ``failed: <error>``."""

    kind: CleanupKind
    detail: str = ""

    @classmethod
    def left(cls, why: str) -> Cleanup:
        """Not cleaned on purpose, because ``why``."""
        return cls(CleanupKind.LEFT, why)

    @classmethod
    def failed(cls, error: str) -> Cleanup:
        """Tried; ``error`` stopped it."""
        return cls(CleanupKind.FAILED, error)

    def __str__(self) -> str:
        if self.kind is CleanupKind.NOT_TRIED:
            return ""
        return f"{self.kind.value}: {self.detail}" if self.detail else self.kind.value


NOT_TRIED = Cleanup(CleanupKind.NOT_TRIED)
CLEANED = Cleanup(CleanupKind.CLEANED)
