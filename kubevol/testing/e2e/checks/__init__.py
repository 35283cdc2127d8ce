"""The checks: each plays one node-side pattern of Kubernetes' storage e2e suites
(kubernetes/kubernetes ``test/e2e/storage/testsuites/<file>.go``, the ``It`` it names)
through the kubelet in the box, and fails naming what the driver did wrong. One module per
group of patterns; :data:`CHECKS` is every check, in the order they run.
"""

from __future__ import annotations

from kubevol.testing.e2e.checks.core import CORE_CHECKS, Check
from kubevol.testing.e2e.checks.ephemeral import EPHEMERAL_CHECKS
from kubevol.testing.e2e.checks.expand import EXPAND_CHECKS
from kubevol.testing.e2e.checks.fsgroup import FSGROUP_CHECKS
from kubevol.testing.e2e.checks.limits import LIMITS_CHECKS
from kubevol.testing.e2e.checks.selinux import SELINUX_CHECKS
from kubevol.testing.e2e.checks.subpath import SUBPATH_CHECKS

#: Every check, in the order they run.
CHECKS: tuple[Check, ...] = (
    *CORE_CHECKS,
    *EXPAND_CHECKS,
    *SUBPATH_CHECKS,
    *EPHEMERAL_CHECKS,
    *FSGROUP_CHECKS,
    *SELINUX_CHECKS,
    *LIMITS_CHECKS,
)

__all__ = ["CHECKS", "Check"]
