"""The outermost layer: turns an exception into the gRPC status the caller sees."""

from __future__ import annotations

import logging
from typing import Any

from kubevol.csi.errors import CSIRPCError, status_for_exception
from kubevol.csi.server.middleware.base import CallInfo, Message, Middleware, Proceed

_log = logging.getLogger("kubevol.csi.server")


class StatusMiddleware(Middleware):
    """Abort the call with the exception's status (INTERNAL for an unexpected exception).

    The status carries no details, as the spec requires. An unexpected exception is logged
    with its traceback (the request is not logged here: it may hold secrets).
    """

    def handle(self, call: CallInfo, request: Message, context: Any, proceed: Proceed) -> Message:
        try:
            return proceed(request)
        except Exception as exc:
            if _already_aborted(context):
                raise
            if not isinstance(exc, CSIRPCError | NotImplementedError):
                _log.exception("%s: unexpected error in driver", call.rpc.name)
            code, message = status_for_exception(exc)
            context.abort(code, message)
            raise AssertionError("unreachable: context.abort raises") from exc


def _already_aborted(context: Any) -> bool:
    """True when an inner layer already set a status via ``context.abort``."""
    code_of = getattr(context, "code", None)
    if code_of is None:
        return False
    try:
        return code_of() is not None
    except Exception:  # older grpc: not available outside the call machinery
        return False
