"""The CSI protobuf messages, for driver authors: typed, so ``mypy --strict`` checks every
field a driver reads or sets.

Services written on :mod:`kubevol.csidriver.server` receive requests and return responses as
these messages::

    from kubevol.csi import pb

    def create_volume(self, request: pb.CreateVolumeRequest, context) -> pb.CreateVolumeResponse:
        return pb.CreateVolumeResponse(volume=pb.Volume(volume_id=..., capacity_bytes=...))

Every message and enum of ``csi.proto`` is here under its proto name (nested ones as
attributes: ``pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER``). The modules are generated
by ``scripts/generate-protos.sh`` (protoc, with mypy-protobuf's stubs); the client side keeps
using :mod:`kubevol.csi.types` and :mod:`kubevol.csi.convert`.
"""

from kubevol.csi._generated.csi_pb2 import *  # noqa: F403  # every message, by proto name
