"""Run the hostpath CSI driver as its own process, for tests that kill it:
``python driver_process.py --endpoint unix:///... --state-dir DIR [--stage-gate FILE]``.

With ``--stage-gate FILE``, while FILE exists NodeStageVolume first does the real work, then
writes ``FILE.entered`` and waits (until FILE goes, or the process is killed): a driver
killed in the middle of NodeStageVolume, after it mounted, before it answered.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--node-id", default="node-1")
    parser.add_argument("--stage-gate", default="")
    args = parser.parse_args()
    driver = HostPathDriver(HostPathConfig(state_dir=args.state_dir, node_id=args.node_id))
    node: Any = driver.plugin.node
    real_stage = node.node_stage_volume
    gate = args.stage_gate

    def gated_stage(request: Any, context: Any) -> Any:
        response = real_stage(request, context)
        if gate and os.path.exists(gate):
            Path(gate + ".entered").write_text(request.volume_id)
            while os.path.exists(gate):
                time.sleep(0.01)
        return response

    node.node_stage_volume = gated_stage
    running = driver.serve(args.endpoint)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    running.stop(grace=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
