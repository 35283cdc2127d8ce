"""What a check says when it does not pass: :class:`CheckFailed` (the driver or the node
side did not do what the kubelet expects) and :class:`CheckSkipped` (the check does not
apply to what the driver advertises), and each check's :class:`Outcome`."""

from __future__ import annotations

import enum

import attrs

from kubevol.csidriver.e2e import RecordedCall
from kubevol.errors import KubevolError

#: How many of a failed check's CSI calls the report shows (the last ones).
CALLS_SHOWN = 14


class CheckFailed(KubevolError, AssertionError):
    """A check failed: ``what`` happened, ``expected`` is what the kubelet expects, ``why``
    says why (the upstream test or the CSI spec rule)."""

    def __init__(self, what: str, *, expected: str, why: str) -> None:
        super().__init__(what)
        self.what = what
        self.expected = expected
        self.why = why


class CheckSkipped(KubevolError):
    """The check does not apply to this driver; the message says why."""


class Status(enum.StrEnum):
    """How a check ended."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@attrs.frozen(kw_only=True)
class Outcome:
    """One check's result: its name, the upstream test it mirrors, how it ended, the reason
    (failure or skip), and for a failure what was expected and why, and the CSI calls the
    node side made (oldest first)."""

    name: str
    mirrors: str
    status: Status
    seconds: float
    reason: str = ""
    expected: str = ""
    why: str = ""
    calls: tuple[RecordedCall, ...] = ()

    def describe(self) -> str:
        """The report's lines for this check (one line when it passed)."""
        head = f"{self.status.value.upper():7} {self.name}  ({self.seconds:.1f}s)"
        if self.status is Status.PASSED:
            return head
        if self.status is Status.SKIPPED:
            return f"{head}\n        skipped: {self.reason}"
        lines = [
            head,
            f"        mirrors:  {self.mirrors}",
            f"        got:      {self.reason}",
            f"        expected: {self.expected}",
            f"        why:      {self.why}",
        ]
        if self.calls:
            shown = self.calls[-CALLS_SHOWN:]
            left = len(self.calls) - len(shown)
            lines.append("        what the kubelet sent and the driver answered"
                         + (f" (last {len(shown)} of {len(self.calls)})" if left else "") + ":")
            lines += [f"          {c.describe()}" for c in shown]
        return "\n".join(lines)
