"""The CSI protocol, shared by the node side and the driver kit: the ``.proto`` files, the
generated code (kept apart in ``_generated``), the typed :mod:`kubevol.csi.pb` module,
:mod:`kubevol.csi.types` and their conversion, endpoints and unix sockets, and the client.

- :class:`CSIClient` calls any CSI driver with :mod:`kubevol.csi.types` in and out;
- :mod:`kubevol.csi.errors` holds the CSI error branch (:class:`CSIRPCError`, ...) and the
  one place gRPC status codes are translated.

The ``kubernetes.io/csi`` volume plugin lives with the other plugins
(:mod:`kubevol.plugins.csi`); the driver kit for driver authors in :mod:`kubevol.csidriver`.

Names are imported on first use, so ``import kubevol.csi`` does not load grpc.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

# gRPC's fork handlers (pthread_atfork) wait for gRPC's threads to reach a safe point before
# every fork; kubevol forks only to exec (mount(8), helpers, drivers), where they protect
# nothing, and under load they deadlocked a subprocess.run() inside fork() for good (seen in
# the test suite, grpcio 1.85: main thread in fork -> cygrpc prefork -> futex). gRPC's
# documented setting for fork+exec programs turns them off; a program that sets it keeps its
# choice. Set before any gRPC import: gRPC reads it once.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

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


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kubevol.csi' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
