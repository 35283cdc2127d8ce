"""Runs kubevol's bundled hostpath driver as its own process for the manager tests:
``python hostpath_process.py STATE_DIR SOCKET [--enable-attach]``; stops on SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver


def main() -> int:
    """Serve until SIGTERM."""
    state_dir, socket_path = sys.argv[1], sys.argv[2]
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    config = HostPathConfig(
        state_dir=state_dir, node_id="node-1", enable_attach="--enable-attach" in sys.argv[3:]
    )
    driver = HostPathDriver(config)
    with driver.serve(f"unix://{socket_path}"):
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
