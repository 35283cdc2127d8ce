"""CSI errors, and the ONE place where gRPC status codes are translated.

::

    KubevolError
    ├── CSIEndpointError (ValueError)        an endpoint string kubevol cannot use
    ├── CSIServeError                        a driver could not be served (socket in use, ...)
    └── CSIRPCError                          a CSI call failed; .code, .method, .message
        └── CSIRPCUncertainError             ... and may have taken effect
                                             (also UncertainProgressError)

Driver code written on :mod:`kubevol.csidriver.server` raises :class:`CSIRPCError` with the status
it wants the caller to see; the client raises it (or its uncertain variant) for failed calls.
"""

from __future__ import annotations

import grpc

from kubevol.errors import KubevolError, UncertainProgressError

#: Codes after which an operation may still be in progress on the driver (the kubelet's
#: ``isFinalError`` is false for exactly these).
NON_FINAL_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


#: Codes after which a node agent may send the same call again (Nomad's ``csimanager``
#: retries exactly these). Code outside :mod:`kubevol.csi` names codes through this module
#: (and :data:`StatusCode`), so that only :mod:`kubevol.csi` imports grpc.
RETRYABLE_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)

#: gRPC's status code enum, for code outside :mod:`kubevol.csi` that names a code.
StatusCode = grpc.StatusCode


class CSIEndpointError(KubevolError, ValueError):
    """An endpoint is neither ``unix://PATH``, ``tcp://HOST:PORT`` nor an absolute path."""


class CSIServeError(KubevolError):
    """A driver could not be served: the socket is in use, cannot be created or owned, ..."""


class CSIRPCError(KubevolError):
    """A CSI RPC failed with gRPC status ``code``.

    ``method`` is the RPC's full name (``/csi.v1.Node/NodePublishVolume``), empty when a driver
    raises the error before the framework knows it; ``message`` is the status message.
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, method: str = "") -> None:
        self.code = code
        self.message = message
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{code.name}: {message}")

    @property
    def is_final(self) -> bool:
        """False when the operation may still be in progress (see :data:`NON_FINAL_CODES`)."""
        return self.code not in NON_FINAL_CODES


class CSIRPCUncertainError(CSIRPCError, UncertainProgressError):
    """A stage, publish or expand call ended with a non-final status: it may have taken effect."""


def error_from_rpc(exc: BaseException, method: str, *, may_progress: bool) -> CSIRPCError:
    """Translate what a gRPC call raised into a :class:`CSIRPCError`.

    ``may_progress`` says the RPC changes state on the node (stage, publish, expand): then a
    non-final code, or a failure that is not a gRPC status at all, gives the uncertain variant,
    as the kubelet does. Chain the result with ``raise ... from exc``.
    """
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        code = exc.code()
        message = exc.details() or ""
    else:
        code = grpc.StatusCode.UNKNOWN
        message = f"transport error: {exc!r}"
        if may_progress:
            return CSIRPCUncertainError(code, message, method=method)
    if may_progress and code in NON_FINAL_CODES:
        return CSIRPCUncertainError(code, message, method=method)
    return CSIRPCError(code, message, method=method)


def status_for_exception(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a driver's failure is reported with: its own code, else INTERNAL.

    ``NotImplementedError`` answers UNIMPLEMENTED, so a service method left abstract on
    purpose reads as "not supported" to the caller.
    """
    if isinstance(exc, CSIRPCError):
        return exc.code, exc.message
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED, str(exc) or "not implemented"
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
