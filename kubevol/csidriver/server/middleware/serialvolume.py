"""Serial volume access: one operation at a time per volume id and per volume name.

Calls that name an existing volume lock its id; CreateVolume locks the requested name. When
the lock is still busy after the timeout the call answers ABORTED, the spec's code for
"an operation is pending for this volume". The lock provider decides how far the exclusion
reaches: this process, or every replica sharing an etcd cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from kubevol.csi._rpc import RPC
from kubevol.csi.errors import CSIRPCError
from kubevol.csidriver.locks import LockKind, LockProviderError, VolumeLockProvider
from kubevol.csidriver.server.middleware.base import CallInfo, Message, Middleware, Proceed

#: RPC -> (lock kind, request field holding the key).
LOCKED_RPCS: Mapping[str, tuple[LockKind, str]] = {
    "CreateVolume": (LockKind.BY_NAME, "name"),
    "DeleteVolume": (LockKind.BY_ID, "volume_id"),
    "ControllerPublishVolume": (LockKind.BY_ID, "volume_id"),
    "ControllerUnpublishVolume": (LockKind.BY_ID, "volume_id"),
    "ControllerExpandVolume": (LockKind.BY_ID, "volume_id"),
    "ControllerModifyVolume": (LockKind.BY_ID, "volume_id"),
    "NodeStageVolume": (LockKind.BY_ID, "volume_id"),
    "NodeUnstageVolume": (LockKind.BY_ID, "volume_id"),
    "NodePublishVolume": (LockKind.BY_ID, "volume_id"),
    "NodeUnpublishVolume": (LockKind.BY_ID, "volume_id"),
    "NodeExpandVolume": (LockKind.BY_ID, "volume_id"),
}


class SerialVolumeMiddleware(Middleware):
    """Hold the volume's lock around the call; ABORTED when busy past ``timeout`` seconds.

    A call without the key (empty id or name) passes unlocked: spec validation, when on,
    has already rejected it, and otherwise the driver answers it. A failing lock backend
    answers UNAVAILABLE.
    """

    def __init__(self, provider: VolumeLockProvider, *, timeout: float = 0.0) -> None:
        self.provider = provider
        self.timeout = timeout

    def applies_to(self, rpc: RPC) -> bool:
        return rpc.name in LOCKED_RPCS

    def handle(
        self, call: CallInfo, request: Message, context: grpc.ServicerContext, proceed: Proceed
    ) -> Message:
        kind, field = LOCKED_RPCS[call.rpc.name]
        key = getattr(request, field)
        if not key:
            return proceed(request)
        try:
            held = self.provider.acquire(kind, key, self.timeout)
        except LockProviderError as exc:
            raise CSIRPCError(
                grpc.StatusCode.UNAVAILABLE, f"volume lock backend failed: {exc}"
            ) from exc
        if held is None:
            what = "name" if kind is LockKind.BY_NAME else "id"
            raise CSIRPCError(
                grpc.StatusCode.ABORTED,
                f"pending: an operation is already in progress for volume {what} {key!r}",
            )
        with held:
            return proceed(request)
