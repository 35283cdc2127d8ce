"""Covers kubevol.node.cleanup.

Clean-up outcomes: code branches on their kind; reports show the same text as before.
"""

from __future__ import annotations

from kubevol.node.cleanup import CLEANED, NOT_TRIED, Cleanup, CleanupKind


def test_outcomes_read_as_reports_show_them() -> None:
    """Not tried reads as "", the others as "cleaned", "left: <why>", "failed: <error>"."""
    assert str(NOT_TRIED) == ""
    assert str(CLEANED) == "cleaned"
    assert str(Cleanup.left("the pod is desired")) == "left: the pod is desired"
    assert str(Cleanup.failed("EBUSY")) == "failed: EBUSY"


def test_kind_not_text_tells_outcomes_apart() -> None:
    """A reason that happens to start with "failed" does not make a left volume failed."""
    left = Cleanup.left("failed mounts are left for the operator")
    assert left.kind is CleanupKind.LEFT
    assert str(left).startswith("left: failed")
    assert Cleanup.failed("x") != Cleanup.left("x")
