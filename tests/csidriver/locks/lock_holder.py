"""A separate OS process that takes etcd volume locks, driven by the tests in this directory.

``hold ENDPOINT DOMAIN KEY TTL``: take the BY_ID lock, print LOCKED, keep it until stdin
closes, release, print RELEASED.
``contend ENDPOINT DOMAIN KEY TTL ROUNDS LOG``: ROUNDS times take the lock, append
"enter PID" and "exit PID" lines to LOG while holding it, release.
"""

from __future__ import annotations

import os
import sys
import time

from kubevol.csidriver.locks import EtcdLockProvider, LockKind


def main(argv: list[str]) -> int:
    """Run one mode; exit 0 on success, 3 if a lock was not obtained in time."""
    mode, endpoint, domain, key, ttl = argv[:5]
    with EtcdLockProvider(endpoints=[endpoint], domain=domain, ttl=float(ttl)) as provider:
        if mode == "hold":
            lock = provider.acquire(LockKind.BY_ID, key, 10)
            if lock is None:
                return 3
            print("LOCKED", flush=True)
            sys.stdin.read()
            lock.release()
            print("RELEASED", flush=True)
            return 0
        rounds, log_path = int(argv[5]), argv[6]
        for _ in range(rounds):
            lock = provider.acquire(LockKind.BY_ID, key, 60)
            if lock is None:
                return 3
            with lock, open(log_path, "a") as log:
                log.write(f"enter {os.getpid()}\n")
                log.flush()
                time.sleep(0.005)
                log.write(f"exit {os.getpid()}\n")
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
