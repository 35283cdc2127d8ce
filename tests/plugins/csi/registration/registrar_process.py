"""A registrar as its own process (the role of node-driver-registrar), for the tests that
kill or stop it: ``python registrar_process.py --socket PATH --name DRIVER --endpoint EP``.

It serves the kubelet's registration API (``GetInfo``, ``NotifyRegistrationStatus``) for one
driver on a unix socket, writes "ready" to stdout once the socket serves, and runs until
SIGTERM (which removes the socket) or SIGKILL (which leaves it).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from kubevol.plugins.csi.registration import RegistrationServer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--endpoint", required=True)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with RegistrationServer(driver_name=args.name, endpoint=args.endpoint,
                            socket_path=args.socket):
        print("ready", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
