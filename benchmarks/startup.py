"""Start-up of the ``kubevol`` command, warm, against ``python -c pass`` in the same run.

Usage::

    .venv/bin/python benchmarks/startup.py [--repeat 20]

Times, interleaved and warm (bytecode written: ``PYTHONDONTWRITEBYTECODE`` is removed from
the children's environment), ``--repeat`` runs of each of:

- the reference: ``python -c pass``, the interpreter's own start-up, which no command can
  beat;
- ``kubevol --help``: the command table, no command module (target: <= 150 ms);
- ``kubevol csi identity probe`` against the bundled mock driver served on a temporary
  socket (target: <= 250 ms): the csi command tree, grpc and one RPC.

It prints the median and best of each, the ratios to the reference, the load average (the
machine may be shared), and exits 1 if a median misses its target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.report import Row, emit, load_average, wait_for_socket, with_bytecode

#: Median wall-clock targets, in milliseconds.
HELP_TARGET_MS = 150.0
PROBE_TARGET_MS = 250.0


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Milliseconds ``argv`` takes to run; it must succeed."""
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="runs of each (default: 20)")
    args = parser.parse_args()
    env = with_bytecode()
    python = sys.executable
    kubevol = os.path.join(os.path.dirname(python), "kubevol")
    with tempfile.TemporaryDirectory(prefix="kubevol-bench-startup-") as tmp:
        sock = os.path.join(tmp, "mock.sock")
        driver = subprocess.Popen(
            [kubevol, "driver", "serve", "mock", "--endpoint", f"unix://{sock}"],
            env=env, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_socket(sock, driver)
            commands = {
                "python -c pass": [python, "-c", "pass"],
                "kubevol --help": [kubevol, "--help"],
                "kubevol csi identity probe": [
                    kubevol, "csi", "identity", "probe", "--endpoint", f"unix://{sock}",
                ],
            }
            for argv in commands.values():  # warm the page cache and write bytecode
                timed(argv, env)
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(args.repeat):
                for name, argv in commands.items():
                    times[name].append(timed(argv, env))
        finally:
            driver.terminate()
            driver.wait(timeout=30)
    print(f"start-up, warm, {args.repeat} interleaved runs each; {load_average()}")
    for name, runs in times.items():
        print(f"  {name:<28} median {statistics.median(runs):7.1f} ms, best {min(runs):7.1f} ms")
    reference = statistics.median(times["python -c pass"])
    rows = [
        Row(work="kubevol --help", unit="ms", kubevol=statistics.median(times["kubevol --help"]),
            reference=reference, reference_name="python -c pass", max_value=HELP_TARGET_MS),
        Row(work="kubevol csi identity probe (mock)", unit="ms",
            kubevol=statistics.median(times["kubevol csi identity probe"]),
            reference=reference, reference_name="python -c pass", max_value=PROBE_TARGET_MS),
    ]
    for row in rows:
        emit(row)
    return 0 if all(row.met for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
