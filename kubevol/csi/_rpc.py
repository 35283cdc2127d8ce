"""The table of CSI RPCs, read once from the generated descriptors.

Client and server both look RPCs up here, so a method's path and message classes are
written down in one place (the ``.proto``).
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import attrs
from google.protobuf.message import Message

from kubevol.csi._pb import csi_pb2

#: The proto package every CSI service lives in.
PACKAGE = "csi.v1"


@attrs.frozen(kw_only=True)
class RPC:
    """One CSI method: ``service`` ("Node"), ``name`` ("NodePublishVolume"), message classes."""

    service: str
    name: str
    request_type: type[Message]
    response_type: type[Message]
    server_streaming: bool = False

    @property
    def path(self) -> str:
        """The gRPC method path, ``/csi.v1.Node/NodePublishVolume``."""
        return f"/{PACKAGE}.{self.service}/{self.name}"


def _load() -> Mapping[str, RPC]:
    table: dict[str, RPC] = {}
    for service in csi_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            table[method.name] = RPC(
                service=service.name,
                name=method.name,
                request_type=getattr(csi_pb2, method.input_type.name),
                response_type=getattr(csi_pb2, method.output_type.name),
                server_streaming=bool(method.server_streaming),
            )
    return types.MappingProxyType(table)


#: Every CSI RPC by method name (names are unique across the CSI services).
RPCS: Mapping[str, RPC] = _load()

#: The services a CSI driver may serve, by short name.
SERVICES: tuple[str, ...] = tuple(csi_pb2.DESCRIPTOR.services_by_name)


def rpc_for_path(path: str) -> RPC | None:
    """The RPC whose gRPC method path is ``path``, or None when it is not a CSI method."""
    prefix = f"/{PACKAGE}."
    if not path.startswith(prefix):
        return None
    _, _, name = path.rpartition("/")
    found = RPCS.get(name)
    return found if found is not None and found.path == path else None
