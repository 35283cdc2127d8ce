"""The base every middleware builds on: a gRPC server interceptor over unary CSI calls.

Inside the framework a failure travels as an exception (a
:class:`~kubevol.csi.errors.CSIRPCError` when it has a status); only the outermost layer,
:class:`~kubevol.csidriver.server.middleware.status.StatusMiddleware`, turns it into a gRPC status.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping

import attrs
import grpc
from google.protobuf import message

from kubevol.csi._rpc import RPC, rpc_for_path

#: A request or response: the CSI message of whichever RPC the middleware wraps (the
#: middlewares read requests generically, by field name).
Message = message.Message
#: Calls the next layer (eventually the driver's method) with a request.
Proceed = Callable[[Message], Message]


@attrs.frozen(kw_only=True)
class CallInfo:
    """What a middleware knows about the call besides the request."""

    rpc: RPC
    #: Invocation metadata, first value per key.
    metadata: Mapping[str, str] = attrs.field(factory=dict)


def _metadata(details: grpc.HandlerCallDetails) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in details.invocation_metadata or ():
        key, value = item
        if isinstance(value, str):
            found.setdefault(key, value)
    return found


class Middleware(grpc.ServerInterceptor, abc.ABC):  # type: ignore[misc]  # grpc is untyped
    """A server interceptor that sees each unary CSI call's request and response.

    Subclasses implement :meth:`handle` and may narrow :meth:`applies_to`; streaming calls
    and non-CSI methods pass through untouched.
    """

    def applies_to(self, rpc: RPC) -> bool:
        """Whether this middleware wraps calls of ``rpc`` (all by default)."""
        return True

    @abc.abstractmethod
    def handle(
        self, call: CallInfo, request: Message, context: grpc.ServicerContext, proceed: Proceed
    ) -> Message:
        """Run around one call: return ``proceed(request)``'s answer, or raise to fail it."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        rpc = rpc_for_path(handler_call_details.method)
        if rpc is None or not self.applies_to(rpc):
            return handler
        inner = handler.unary_unary
        call = CallInfo(rpc=rpc, metadata=_metadata(handler_call_details))

        def behavior(request: Message, context: grpc.ServicerContext) -> Message:
            return self.handle(call, request, context, lambda req: inner(req, context))

        return handler._replace(unary_unary=behavior)
