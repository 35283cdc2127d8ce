"""A recording gRPC relay for CSI: it listens on a unix socket of its own, forwards each
CSI call to the driver unchanged (metadata and deadline included) and keeps a copy of the
request and of the answer, secrets stripped (:mod:`kubevol.csi.redact`)::

    with RecordingRelay("unix:///run/driver.sock", "/tmp/box/relay.sock") as relay:
        ...  # point the node side at relay.endpoint
        for call in relay.calls_since(mark):
            print(call.describe())

Methods that are not CSI methods are answered UNIMPLEMENTED without reaching the driver.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures

import attrs
import grpc

from kubevol.csi._rpc import RPC, rpc_for_path
from kubevol.csi.endpoint import parse_endpoint
from kubevol.csi.redact import Redactor
from kubevol.util.lifecycle import ClosesOnExit

#: How many calls the relay keeps (the oldest are dropped first).
MAX_KEPT = 5000


@attrs.frozen(kw_only=True)
class RecordedCall:
    """One call through the relay: its number, method, request and the answer (a response,
    or a status code and message), as text with secrets stripped."""

    seq: int
    method: str
    request: str
    response: str = ""
    code: str = "OK"
    message: str = ""

    @property
    def ok(self) -> bool:
        """Whether the driver answered OK."""
        return self.code == "OK"

    def describe(self) -> str:
        """``#n Method(request) -> response`` (or ``-> CODE: message``), on one line each."""
        request = " ".join(self.request.split()) or "{}"
        answer = (" ".join(self.response.split()) or "{}") if self.ok else (
            f"{self.code}: {self.message}"
        )
        return f"#{self.seq} {self.method}({request}) -> {answer}"


class RecordingRelay(ClosesOnExit):
    """Relays CSI calls from ``listen_path`` (a unix socket path it creates, mode 0600) to
    the driver at ``target`` and records them. Thread-safe; close it when done."""

    def __init__(self, target: str, listen_path: str, *, workers: int = 16) -> None:
        self.target = parse_endpoint(target)
        self.listen_path = listen_path
        self._channel = grpc.insecure_channel(self.target.grpc_target)
        self._lock = threading.Lock()
        self._calls: list[RecordedCall] = []
        self._seq = 0
        self._redactor = Redactor()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(listen_path)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        self._server.add_generic_rpc_handlers((_Handler(self),))
        old = os.umask(0o077)
        try:
            self._server.add_insecure_port(f"unix:{listen_path}")
        finally:
            os.umask(old)
        self._server.start()

    @property
    def endpoint(self) -> str:
        """``unix://<listen_path>``: where the node side connects."""
        return f"unix://{self.listen_path}"

    def mark(self) -> int:
        """The number of the last call so far (for :meth:`calls_since`)."""
        with self._lock:
            return self._seq

    def calls_since(self, mark: int = 0, methods: Sequence[str] = ()) -> list[RecordedCall]:
        """The calls after ``mark``, oldest first; only ``methods`` when given."""
        with self._lock:
            return [c for c in self._calls
                    if c.seq > mark and (not methods or c.method in methods)]

    def close(self) -> None:
        """Stop relaying (calls in flight get a second) and close the driver channel."""
        self._server.stop(1).wait()
        self._channel.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen_path)

    # -- relaying ----------------------------------------------------------------------------

    def _record(self, method: str, request: object, response: object | None,
                code: str = "OK", message: str = "") -> None:
        req = self._redactor.to_text(request)
        rep = self._redactor.to_text(response) if response is not None else ""
        with self._lock:
            self._seq += 1
            self._calls.append(RecordedCall(seq=self._seq, method=method, request=req,
                                            response=rep, code=code, message=message))
            del self._calls[:-MAX_KEPT]

    def unary(self, rpc: RPC) -> Callable[[object, grpc.ServicerContext], object]:
        forward = self._channel.unary_unary(
            rpc.path, request_serializer=rpc.request_type.SerializeToString,
            response_deserializer=rpc.response_type.FromString,
        )

        def behaviour(request: object, context: grpc.ServicerContext) -> object:
            try:
                response = forward(request, timeout=context.time_remaining(),
                                   metadata=context.invocation_metadata())
            except grpc.RpcError as exc:
                code, details = _status(exc)
                self._record(rpc.name, request, None, code.name, details)
                context.abort(code, details)
            self._record(rpc.name, request, response)
            return response

        return behaviour

    def streaming(self, rpc: RPC) -> Callable[[object, grpc.ServicerContext], Iterator[object]]:
        forward = self._channel.unary_stream(
            rpc.path, request_serializer=rpc.request_type.SerializeToString,
            response_deserializer=rpc.response_type.FromString,
        )

        def behaviour(request: object, context: grpc.ServicerContext) -> Iterator[object]:
            count = 0
            try:
                for response in forward(request, timeout=context.time_remaining(),
                                        metadata=context.invocation_metadata()):
                    count += 1
                    yield response
            except grpc.RpcError as exc:
                code, details = _status(exc)
                self._record(rpc.name, request, None, code.name, details)
                context.abort(code, details)
            self._record(rpc.name, request, None, "OK", f"{count} responses streamed")

        return behaviour


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    status = code() if callable(code) else grpc.StatusCode.UNKNOWN
    return status, str(details() if callable(details) else exc)


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, relay: RecordingRelay) -> None:
        self.relay = relay

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        rpc = rpc_for_path(str(details.method))
        if rpc is None:
            return None
        if rpc.server_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self.relay.streaming(rpc), request_deserializer=rpc.request_type.FromString,
                response_serializer=rpc.response_type.SerializeToString,
            )
        return grpc.unary_unary_rpc_method_handler(
            self.relay.unary(rpc), request_deserializer=rpc.request_type.FromString,
            response_serializer=rpc.response_type.SerializeToString,
        )
