"""The wire half of the kubelet-in-a-box e2e suite: a relay that stands between the node
side and a CSI driver and records every call (what the kubelet sent, what the driver
answered), so that a failed check can show both.

The suite itself is :mod:`kubevol.testing.e2e`: it drives kubevol's node volume manager
(:mod:`kubevol.node`), a layer above the driver kit, so it cannot live here; this package
holds only what speaks gRPC, which the layering keeps inside the CSI packages.
"""

from __future__ import annotations

from kubevol.csidriver.e2e.recorder import RecordedCall, RecordingRelay

__all__ = ["RecordedCall", "RecordingRelay"]
