"""A node agent as its own process, for the crash tests:
``python agent_process.py --root DIR --driver NAME=ENDPOINT``.

It rebuilds its state from disk, then follows the pod records under the root (running pods
set up, terminating ones torn down) until SIGTERM. Backoff is capped at 1 s so a test does
not wait minutes for a retry.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from kubevol.node.runtime import NodeRuntime, parse_driver_flag


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--driver", action="append", default=[])
    parser.add_argument("--node-name", default="node-1")
    parser.add_argument("--ready", default="", help="file written once reconstructed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="agent %(asctime)s %(levelname)s %(name)s: %(message)s")
    drivers = dict(parse_driver_flag(d) for d in args.driver)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with NodeRuntime(args.root, node_name=args.node_name, csi_drivers=drivers,
                     csi_timeout=10, registration_timeout=2) as runtime:
        pods = runtime.volume_manager(workers=4, initial_backoff=0.05, max_backoff=1.0)
        pods.reconstruct()
        if args.ready:
            Path(args.ready).write_text("ready\n")
        pods.run(stop, period=0.05)
        pods.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
