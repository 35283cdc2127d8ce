"""``X_CSI_PLUGIN_INFO``: answer GetPluginInfo from configuration, without the driver."""

from __future__ import annotations

import grpc

from kubevol.csi import pb
from kubevol.csi._rpc import RPC
from kubevol.csidriver.server.config import PluginInfoOverride
from kubevol.csidriver.server.middleware.base import CallInfo, Message, Middleware, Proceed


class PluginInfoMiddleware(Middleware):
    """Short-circuit GetPluginInfo with a fixed name, version and manifest."""

    def __init__(self, info: PluginInfoOverride) -> None:
        self._response = pb.GetPluginInfoResponse(
            name=info.name, vendor_version=info.vendor_version, manifest=dict(info.manifest)
        )

    def applies_to(self, rpc: RPC) -> bool:
        return rpc.name == "GetPluginInfo"

    def handle(
        self, call: CallInfo, request: Message, context: grpc.ServicerContext, proceed: Proceed
    ) -> Message:
        answer = pb.GetPluginInfoResponse()
        answer.CopyFrom(self._response)
        return answer
