"""A kubelet in a box for CSI driver authors (issue 33): the node-side patterns of
Kubernetes' storage e2e suites (``volumes``, ``volume_io``, ``multivolume``,
``volumemode``, ``volume_expand``, ``subpath``, ``ephemeral``, ``fsgroupchangepolicy``,
``selinuxmount``, ``readwriteoncepod``, ``volumelimits``, ``topology``, ``disruptive``;
:mod:`kubevol.testing.e2e.checks`), run against any driver
without a cluster, through kubevol's own ``kubernetes.io/csi`` plugin and node volume
manager on a private kubelet-style root. ``kubevol driver e2e`` runs it; so does pytest with
the plugin :mod:`kubevol.testing.e2e.plugin`.

It lives here, at the testing layer, and not in :mod:`kubevol.csidriver` (the driver kit,
where driver authors look for it) because it drives :mod:`kubevol.node`, a layer above the
driver kit; the part that speaks gRPC (a relay recording every call) is
:mod:`kubevol.csidriver.e2e`.

Needs root (real mounts), in the driver's mount namespace (a private one: see
``kubevol driver e2e --help``).
"""

from __future__ import annotations

from kubevol.testing.e2e.checks import CHECKS, Check
from kubevol.testing.e2e.report import CheckFailed, CheckSkipped, Outcome, Status
from kubevol.testing.e2e.runner import DriverProcess, E2EError, run_checks, selected
from kubevol.testing.e2e.session import E2EConfig

__all__ = [
    "CHECKS",
    "Check",
    "CheckFailed",
    "CheckSkipped",
    "DriverProcess",
    "E2EConfig",
    "E2EError",
    "Outcome",
    "Status",
    "run_checks",
    "selected",
]
