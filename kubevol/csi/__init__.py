"""CSI for kubevol: the wire protocol, a client for any CSI driver, and a driver framework.

- :class:`CSIClient` calls any CSI driver with :mod:`kubevol.csi.types` in and out;
- :mod:`kubevol.csi.errors` holds the CSI error branch (:class:`CSIRPCError`, ...);
- :mod:`kubevol.csi.server` serves drivers written in Python (gocsi's role);
- :mod:`kubevol.csi.locks` holds the serial-volume lock providers.

Names are imported on first use, so ``import kubevol.csi`` does not load grpc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubevol.csi.client import DEFAULT_TIMEOUT, CSIClient
    from kubevol.csi.errors import (
        CSIEndpointError,
        CSIRPCError,
        CSIRPCUncertainError,
        CSIServeError,
    )

_LAZY = {
    "CSIClient": "kubevol.csi.client",
    "DEFAULT_TIMEOUT": "kubevol.csi.client",
    "CSIEndpointError": "kubevol.csi.errors",
    "CSIRPCError": "kubevol.csi.errors",
    "CSIRPCUncertainError": "kubevol.csi.errors",
    "CSIServeError": "kubevol.csi.errors",
}

__all__ = [
    "DEFAULT_TIMEOUT",
    "CSIClient",
    "CSIEndpointError",
    "CSIRPCError",
    "CSIRPCUncertainError",
    "CSIServeError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kubevol.csi' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
