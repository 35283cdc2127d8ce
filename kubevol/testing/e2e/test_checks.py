"""The suite's checks as pytest tests (collected with ``--pyargs kubevol.testing.e2e``, run
by the plugin :mod:`kubevol.testing.e2e.plugin`)."""

from __future__ import annotations

import pytest

from kubevol.testing.e2e.checks import CHECKS, Check
from kubevol.testing.e2e.report import Status
from kubevol.testing.e2e.runner import E2ESuite


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_check(check: Check, kubelet_e2e: E2ESuite) -> None:
    """The check passes against the driver (or does not apply to it, and says why)."""
    outcome = kubelet_e2e.run(check)
    if outcome.status is Status.SKIPPED:
        pytest.skip(outcome.reason)
    if outcome.status is Status.FAILED:
        pytest.fail(outcome.describe(), pytrace=False)
