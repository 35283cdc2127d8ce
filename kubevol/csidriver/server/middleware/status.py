"""The outermost layer: turns an exception into the gRPC status the caller sees."""

from __future__ import annotations

import logging

import grpc

from kubevol.csi.errors import CSIRPCError, status_for_exception
from kubevol.csidriver.server.middleware.base import CallInfo, Message, Middleware, Proceed

_log = logging.getLogger("kubevol.csidriver.server")


class StatusMiddleware(Middleware):
    """Abort the call with the exception's status (INTERNAL for an unexpected exception).

    The status carries no details, as the spec requires. Every failed call is logged at
    ERROR as ``METHOD failed: CODE: message`` (as Go drivers log them through klog); an
    unexpected exception with its traceback. The request is not logged here: it may hold
    secrets.
    """

    def handle(
        self, call: CallInfo, request: Message, context: grpc.ServicerContext, proceed: Proceed
    ) -> Message:
        try:
            return proceed(request)
        except Exception as exc:
            aborted = _aborted_code(context)
            if aborted is not None:  # a driver or interceptor called context.abort itself
                _log.error("%s failed: %s: %s", call.rpc.name, aborted.name,
                           _aborted_details(context))
                raise
            code, message = status_for_exception(exc)
            if isinstance(exc, CSIRPCError | NotImplementedError):
                _log.error("%s failed: %s: %s", call.rpc.name, code.name, message)
            else:
                _log.exception("%s failed: %s: %s (unexpected error in driver)",
                               call.rpc.name, code.name, message)
            context.abort(code, message)
            raise AssertionError("unreachable: context.abort raises") from exc


def _aborted_code(context: object) -> grpc.StatusCode | None:
    """The status an inner layer already set with ``context.abort``, if any."""
    code_of = getattr(context, "code", None)
    if code_of is None:
        return None
    try:
        code = code_of()
    except Exception:  # older grpc: not available outside the call machinery
        return None
    return code if isinstance(code, grpc.StatusCode) else None


def _aborted_details(context: object) -> str:
    details_of = getattr(context, "details", None)
    try:
        raw = details_of() if details_of is not None else b""
    except Exception:  # same as above
        return ""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")


def call_status(exc: BaseException, context: object) -> tuple[grpc.StatusCode, str]:
    """The status a failed call ends with: set by ``context.abort``, else from ``exc``."""
    code = _aborted_code(context)
    if code is not None:
        return code, _aborted_details(context)
    return status_for_exception(exc)
