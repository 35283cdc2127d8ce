"""The floor of the agent's idle row (``benchmarks/agent.py``): the CPU a bare grpcio client
spends asking a CSI driver the same NodeGetVolumeStats the agent asks once a minute.

Run by ``benchmarks.agent`` as a process of its own, beside the idle agent::

    python -m benchmarks.stats_floor ENDPOINT REQUESTS_JSON [--rounds 5]

``REQUESTS_JSON`` is a list of ``[volume_id, volume_path]`` (the driver's record of what the
agent asked). Each round sends every request at once as a future on one channel (the
cheapest way grpcio has: blocking calls one by one, or ``grpc.aio``, cost more CPU per call
here) and waits for all the answers. Prints the process's CPU seconds (all threads, gRPC's
own included) of the median round as JSON: ``{"cpu": ..., "calls": ...}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics

import grpc

from kubevol.csi._rpc import RPCS
from kubevol.csi.endpoint import parse_endpoint

#: The one method asked (its path and message classes, as the CSI client has them).
ASKED = RPCS["NodeGetVolumeStats"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoint")
    parser.add_argument("requests", help="JSON file: a list of [volume_id, volume_path]")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with open(args.requests, encoding="utf-8") as f:
        requests = [ASKED.request_type(volume_id=v, volume_path=p) for v, p in json.load(f)]
    with grpc.insecure_channel(parse_endpoint(args.endpoint).grpc_target) as channel:
        ask = channel.unary_unary(
            ASKED.path,
            request_serializer=ASKED.request_type.SerializeToString,
            response_deserializer=ASKED.response_type.FromString,
        )
        ask.future(requests[0], timeout=30).result()  # connected before the first round
        rounds = []
        for _ in range(args.rounds):
            started = _cpu()
            for answer in [ask.future(r, timeout=30) for r in requests]:
                answer.result()
            rounds.append(_cpu() - started)
    print(json.dumps({"cpu": statistics.median(rounds), "calls": len(requests)}))


if __name__ == "__main__":
    main()
