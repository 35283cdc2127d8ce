"""The framework's middleware, as gRPC server interceptors, and the chain gocsi orders.

Outermost first: status translation, the plugin's own interceptors, request id, logging,
spec validation, plugin info, serial volume access.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from kubevol.csidriver.locks import VolumeLockProvider
from kubevol.csidriver.server.config import ServerConfig
from kubevol.csidriver.server.middleware.base import CallInfo, Middleware, Proceed
from kubevol.csidriver.server.middleware.logging import LOGGER_NAME, LoggingMiddleware
from kubevol.csidriver.server.middleware.plugininfo import PluginInfoMiddleware
from kubevol.csidriver.server.middleware.requestid import (
    REQUEST_ID_KEY,
    RequestIDMiddleware,
    current_request_id,
)
from kubevol.csidriver.server.middleware.serialvolume import LOCKED_RPCS, SerialVolumeMiddleware
from kubevol.csidriver.server.middleware.specvalidation import SpecRules, SpecValidationMiddleware
from kubevol.csidriver.server.middleware.status import StatusMiddleware

__all__ = [
    "LOCKED_RPCS",
    "LOGGER_NAME",
    "REQUEST_ID_KEY",
    "CallInfo",
    "LoggingMiddleware",
    "Middleware",
    "PluginInfoMiddleware",
    "Proceed",
    "RequestIDMiddleware",
    "SerialVolumeMiddleware",
    "SpecRules",
    "SpecValidationMiddleware",
    "StatusMiddleware",
    "build_chain",
    "current_request_id",
]


def build_chain(
    config: ServerConfig,
    *,
    extra: Sequence[grpc.ServerInterceptor] = (),
    lock_provider: VolumeLockProvider | None = None,
) -> list[grpc.ServerInterceptor]:
    """The interceptors ``config`` switches on, outermost first (gocsi's order).

    ``extra`` (the plugin's interceptors) sit just inside status translation, so they see
    failures as exceptions. Serial volume access needs ``lock_provider`` when it is on.
    """
    chain: list[grpc.ServerInterceptor] = [StatusMiddleware(), *extra]
    logging_on = config.req_logging or config.rep_logging
    if logging_on:
        # As in gocsi, request ids exist to correlate log lines.
        chain.append(RequestIDMiddleware())
        chain.append(
            LoggingMiddleware(
                requests=config.req_logging,
                responses=config.rep_logging,
                drop_volume_context=config.log_disable_vol_ctx,
            )
        )
    if config.req_validation or config.rep_validation:
        chain.append(
            SpecValidationMiddleware(
                SpecRules.from_config(config),
                requests=config.req_validation,
                responses=config.rep_validation,
            )
        )
    if config.plugin_info is not None:
        chain.append(PluginInfoMiddleware(config.plugin_info))
    if config.serial_vol_access:
        if lock_provider is None:
            raise ValueError("serial volume access is on but no lock provider was given")
        chain.append(
            SerialVolumeMiddleware(lock_provider, timeout=config.serial_vol_access_timeout)
        )
    return chain
