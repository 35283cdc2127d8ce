"""Request ids: the caller's ``csi.requestid`` metadata, else a per-server counter."""

from __future__ import annotations

import contextvars
import itertools

import grpc

from kubevol.csidriver.server.middleware.base import CallInfo, Message, Middleware, Proceed

#: The metadata key a CO may send its request id under (gocsi's).
REQUEST_ID_KEY = "csi.requestid"

# Per call, not global state: each call runs in its own context on a worker thread.
_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar(
    "kubevol_csi_request_id", default=""
)


def current_request_id() -> str:
    """The id of the call being served on this thread ("" outside a call or when off)."""
    return _REQUEST_ID.get()


class RequestIDMiddleware(Middleware):
    """Set :func:`current_request_id` for the duration of each call."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)  # next() on a count is atomic under the GIL

    def handle(
        self, call: CallInfo, request: Message, context: grpc.ServicerContext, proceed: Proceed
    ) -> Message:
        request_id = call.metadata.get(REQUEST_ID_KEY) or f"{next(self._counter):04d}"
        token = _REQUEST_ID.set(request_id)
        try:
            return proceed(request)
        finally:
            _REQUEST_ID.reset(token)
