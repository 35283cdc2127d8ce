"""Client-side request and response logging (csc's ``--with-request-logging`` and
``--with-response-logging``), secrets redacted.

:func:`logging_interceptor` returns a gRPC client interceptor that logs, at INFO on the
``kubevol.csi.client`` logger, ``Method: REQ n: fields`` before each call and ``Method: REP n:
fields`` (or ``error CODE: message``) after it, numbered per client like gocsi's request ids.
Every ``csi_secret`` field is replaced before a message is formatted.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import TypeAlias

import grpc
from google.protobuf.message import Message

from kubevol.csi.redact import Redactor

#: The logger requests and responses go to, at INFO.
LOGGER_NAME = "kubevol.csi.client"


class _LoggingInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, *, requests: bool, responses: bool) -> None:
        self.requests = requests
        self.responses = responses
        self._ids = itertools.count(1)
        self._redactor = Redactor()
        self._log = logging.getLogger(LOGGER_NAME)

    def _method(self, details: grpc.ClientCallDetails) -> str:
        return str(details.method).rsplit("/", 1)[-1]

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Message], grpc.Future],
        details: grpc.ClientCallDetails,
        request: Message,
    ) -> grpc.Future:
        method, n = self._method(details), next(self._ids)
        if self.requests:
            self._log.info("%s: REQ %04d: %s", method, n, self._redactor.to_text(request))
        outcome = continuation(details, request)
        if self.responses:
            error = outcome.exception()
            if error is not None:
                self._log.info(
                    "%s: REP %04d: error %s: %s", method, n, error.code().name, error.details()
                )
            else:
                self._log.info(
                    "%s: REP %04d: %s", method, n, self._redactor.to_text(outcome.result())
                )
        return outcome

    def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Message], grpc.Call],
        details: grpc.ClientCallDetails,
        request: Message,
    ) -> grpc.Call:
        method, n = self._method(details), next(self._ids)
        if self.requests:
            self._log.info("%s: REQ %04d: %s", method, n, self._redactor.to_text(request))
        return continuation(details, request)  # streamed responses are not logged one by one


#: What :func:`logging_interceptor` returns, named for callers that do not import grpc.
ClientInterceptor: TypeAlias = grpc.UnaryUnaryClientInterceptor


def logging_interceptor(*, requests: bool, responses: bool) -> ClientInterceptor:
    """An interceptor for :class:`~kubevol.csi.client.CSIClient` that logs what it sends
    (``requests``) and what comes back (``responses``)."""
    return _LoggingInterceptor(requests=requests, responses=responses)
