"""CSI round trips over a unix socket: kubevol's client and server, against raw gRPC stubs.

Run: ``.venv/bin/python benchmarks/csi_roundtrip.py [--calls 1000] [--repeat 5]``

A no-op driver built on :mod:`kubevol.csidriver.server` is served in this process on a socket in
a temporary directory, twice: bare (no middleware) and with spec validation plus in-process
serial volume access switched on. For each server it times, per call:

* ``NodeGetCapabilities``: ``CSIClient.node_get_capabilities(refresh=True)`` (attrs types
  out, error mapping) against a raw generated stub call on the SAME channel;
* a ``NodePublishVolume`` + ``NodeUnpublishVolume`` pair, the same way.

It prints microseconds per call (median of ``--repeat`` runs) and the ratio kubevol / raw,
which is the client's own overhead on top of gRPC (both sides share the server's cost).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubevol.csi import convert
from kubevol.csi import types as t
from kubevol.csi._pb import csi_pb2
from kubevol.csi.client import CSIClient
from kubevol.csidriver.server import (
    IdentityService,
    NodeService,
    StoragePlugin,
    serve_in_background,
)

csi_grpc: Any = importlib.import_module("kubevol.csi._generated.csi_pb2_grpc")

CAP = t.VolumeCapability.mount()


class _Identity(IdentityService):
    def get_plugin_info(self, request: Any, context: Any) -> Any:
        return csi_pb2.GetPluginInfoResponse(name="bench.kubevol.io", vendor_version="1.0")


class _Node(NodeService):
    """Answers at once; publishes nothing."""

    def node_get_capabilities(self, request: Any, context: Any) -> Any:
        return convert.node_capabilities_to_pb([t.NodeCapability.STAGE_UNSTAGE_VOLUME])

    def node_publish_volume(self, request: Any, context: Any) -> Any:
        return csi_pb2.NodePublishVolumeResponse()

    def node_unpublish_volume(self, request: Any, context: Any) -> Any:
        return csi_pb2.NodeUnpublishVolumeResponse()


def _compare(
    raw: Callable[[], object], kv: Callable[[], object], calls: int, repeat: int
) -> tuple[float, float]:
    """Median µs per call of ``raw`` and ``kv``, their runs interleaved to share any noise."""
    for _ in range(min(200, calls)):
        raw()
        kv()
    raw_samples: list[float] = []
    kv_samples: list[float] = []
    for _ in range(repeat):
        for fn, samples in ((raw, raw_samples), (kv, kv_samples)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(raw_samples), statistics.median(kv_samples)


def _bench(label: str, env: dict[str, str], calls: int, repeat: int, workdir: Path) -> None:
    plugin = StoragePlugin(identity=_Identity(), node=_Node())
    socket_path = workdir / f"{label}.sock"
    handle = serve_in_background(plugin, f"unix://{socket_path}", env=env)
    target = str(workdir / "target")
    try:
        with CSIClient(handle.address) as client:
            stub = csi_grpc.NodeStub(client.channel)
            caps_req = csi_pb2.NodeGetCapabilitiesRequest()
            pub_req = csi_pb2.NodePublishVolumeRequest(
                volume_id="vol-1",
                target_path=target,
                volume_capability=convert.capability_to_pb(CAP),
            )
            unpub_req = csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-1", target_path=target)

            def raw_caps() -> None:
                stub.NodeGetCapabilities(caps_req, timeout=120)

            def kv_caps() -> None:
                client.node_get_capabilities(refresh=True)

            def raw_pair() -> None:
                stub.NodePublishVolume(pub_req, timeout=120)
                stub.NodeUnpublishVolume(unpub_req, timeout=120)

            def kv_pair() -> None:
                client.node_publish_volume("vol-1", target, CAP)
                client.node_unpublish_volume("vol-1", target)

            rows = [
                ("NodeGetCapabilities", raw_caps, kv_caps),
                ("NodePublish+NodeUnpublish pair", raw_pair, kv_pair),
            ]
            print(f"\nserver: {label}")
            print(f"  {'call':32} {'raw stub µs':>12} {'kubevol µs':>12} {'ratio':>7}")
            for name, raw, kv in rows:
                raw_us, kv_us = _compare(raw, kv, calls, repeat)
                print(f"  {name:32} {raw_us:12.1f} {kv_us:12.1f} {kv_us / raw_us:7.2f}")
    finally:
        handle.stop(grace=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs; the median is shown")
    args = parser.parse_args()
    print(
        f"{args.calls} calls x {args.repeat} runs, median; µs per call (a pair counts as one call)"
    )
    with tempfile.TemporaryDirectory(prefix="kubevol-csi-bench-") as tmp:
        _bench("bare", {}, args.calls, args.repeat, Path(tmp))
        _bench(
            "validation+serial",
            {"X_CSI_SPEC_VALIDATION": "true", "X_CSI_SERIAL_VOL_ACCESS": "true"},
            args.calls,
            args.repeat,
            Path(tmp),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
