"""Run the test driver as its own process: ``python driver_process.py``.

Reads ``CSI_ENDPOINT`` and every ``X_CSI_*`` variable like any gocsi driver. Test-only
variables: ``TEST_DRIVER_SLEEP_<RPC>=seconds`` makes that RPC take that long, and
``TEST_DRIVER_READY_FILE`` is written before the server listens, and
``TEST_DRIVER_ENTERED_DIR`` gets a file named after each RPC the driver enters.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubevol.csi.server import serve
from tests.csi.driver import Behaviour, make_plugin


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    behaviour = Behaviour()
    for key, value in os.environ.items():
        if key.startswith("TEST_DRIVER_SLEEP_"):
            behaviour.sleep[key[len("TEST_DRIVER_SLEEP_") :]] = float(value)
    behaviour.entered_dir = os.environ.get("TEST_DRIVER_ENTERED_DIR")
    ready = os.environ.get("TEST_DRIVER_READY_FILE")

    def mark_ready(plugin: object, config: object) -> None:
        if ready:
            Path(ready).write_text("configured\n")

    plugin, _ = make_plugin(behaviour, before_serve=mark_ready)
    return serve(plugin)


if __name__ == "__main__":
    sys.exit(main())
