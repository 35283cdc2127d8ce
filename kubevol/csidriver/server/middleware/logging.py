"""Request and response logging with secrets redacted (``X_CSI_REQ_LOGGING``, ``_REP_``)."""

from __future__ import annotations

import logging

import grpc

from kubevol.csi.redact import Redactor
from kubevol.csidriver.server.middleware.base import CallInfo, Message, Middleware, Proceed
from kubevol.csidriver.server.middleware.requestid import current_request_id
from kubevol.csidriver.server.middleware.status import call_status

#: The logger requests and responses go to, at INFO.
LOGGER_NAME = "kubevol.csidriver.server"


class LoggingMiddleware(Middleware):
    """Log ``Method: REQ id: fields`` and ``Method: REP id: fields`` (or the error status).

    Every value of a ``csi_secret`` field is replaced before the message is formatted, at any
    depth; with ``drop_volume_context`` volume contexts are left out as well.
    """

    def __init__(
        self, *, requests: bool, responses: bool, drop_volume_context: bool = False
    ) -> None:
        self.requests = requests
        self.responses = responses
        self._redactor = Redactor(drop_volume_context=drop_volume_context)
        self._log = logging.getLogger(LOGGER_NAME)

    def handle(
        self, call: CallInfo, request: Message, context: grpc.ServicerContext, proceed: Proceed
    ) -> Message:
        name = call.rpc.name
        if self.requests and self._log.isEnabledFor(logging.INFO):
            self._log.info(
                "%s: REQ %s: %s", name, current_request_id(), self._redactor.to_text(request)
            )
        try:
            response = proceed(request)
        except Exception as exc:
            if self.responses:
                code, message = call_status(exc, context)
                self._log.info(
                    "%s: REP %s: error %s: %s", name, current_request_id(), code.name, message
                )
            raise
        if self.responses and self._log.isEnabledFor(logging.INFO):
            self._log.info(
                "%s: REP %s: %s", name, current_request_id(), self._redactor.to_text(response)
            )
        return response
