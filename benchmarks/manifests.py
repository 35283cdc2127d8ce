"""Benchmark: load the manifests of 500 pods (issue 18's case) through kubevol's bounded
YAML loading (:mod:`kubevol.util.safeyaml`: size caps, go-yaml's alias rule, depth measured on
libyaml's parse events, then libyaml's CSafeLoader), against the bare loaders in the same
run.

Run: ``.venv/bin/python -m benchmarks.manifests [--pods 500] [--repeat 7]``.

Rows: kubevol against bare ``yaml.load_all(CSafeLoader)`` (the strongest reference: the
bounds must cost little; target ratio <= 1.5), and for information against bare
``yaml.safe_load_all`` (pure-Python SafeLoader, what ``up`` used before: 827 ms in issue 18).
Best of ``--repeat`` runs, interleaved. The machine may be shared: the load average is
printed with the figures.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import yaml

from benchmarks.report import Row, emit, load_average
from kubevol.util import safeyaml

POD = """apiVersion: v1
kind: Pod
metadata:
  name: web-{i}
  namespace: shop
  labels: {{app: web, tier: "t{i}"}}
spec:
  securityContext:
    fsGroup: 1000
  containers:
  - name: c
    image: busybox
    args: ["sh", "-c", "sleep 3600"]
    env:
    - name: A
      value: "1"
    volumeMounts:
    - name: scratch
      mountPath: /data
  volumes:
  - name: scratch
    emptyDir: {{sizeLimit: 64Mi}}
  - name: data
    persistentVolumeClaim:
      claimName: claim-{i}
"""


def best(load: Callable[[str], Any], text: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        load(text)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    text = "---\n".join(POD.format(i=i) for i in range(args.pods))
    print(f"{args.pods} pods, {len(text)} bytes; {load_average()}")
    c_loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    ours = best(lambda t: safeyaml.load_all(t, "bench"), text, args.repeat)
    bare_c = best(lambda t: list(yaml.load_all(t, Loader=c_loader)), text, args.repeat)
    bare_py = best(lambda t: list(yaml.safe_load_all(t)), text, max(1, args.repeat // 3))
    print(f"after: {load_average()}")
    emit(Row(work=f"load {args.pods} pod manifests", unit="ms", kubevol=ours * 1000,
             reference=bare_c * 1000, reference_name="bare CSafeLoader", max_ratio=1.5))
    emit(Row(work=f"load {args.pods} pod manifests", unit="ms", kubevol=ours * 1000,
             reference=bare_py * 1000, reference_name="bare SafeLoader (before)",
             note="information: the pure-Python loader up used before"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
