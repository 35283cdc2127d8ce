"""``python -m benchmarks`` (``make bench``): run every benchmark, then print one table of
kubevol's figures against their references, with the load average before and after.

Each benchmark runs in a process of its own (as root, the ones that mount run in a private
mount namespace) and prints its details as it goes; the rows it emits
(:mod:`benchmarks.report`) are gathered into the table. Exit status 1 when a target is
missed or a benchmark fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.report import MARKER, Row, load_average

#: (module, arguments, needs a private mount namespace when run as root).
BENCHMARKS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("mountinfo", (), False),
    ("guard", (), False),
    ("reconstruct", ("--repeat", "3"), True),
    ("real_node_scale", ("--repeat", "3"), True),
    # 3d26097: main before issue 18 (the driver the issue measured at 44 and 68 per second).
    ("csi_lifecycle", ("--skip-suite", "--lifecycles", "20", "--baseline", "3d26097"), False),
    ("down", (), False),
    # Issue 36: the long-running agent (about 3.5 minutes; it mounts in a namespace of its
    # own, re-executing itself like down).
    ("agent", (), False),
    ("du", ("--repeat", "5"), False),
    ("manifests", (), False),
)


def run(module: str, args: tuple[str, ...], private: bool) -> tuple[list[Row], int]:
    """Run one benchmark, echoing its output; its rows and exit status."""
    command = [sys.executable, "-m", f"benchmarks.{module}", *args]
    if private and os.geteuid() == 0:
        command = ["unshare", "-m", "--propagation", "private", *command]
    print(f"\n=== {module} {' '.join(args)}", flush=True)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    rows = []
    for line in proc.stdout:
        if line.startswith(MARKER):
            rows.append(Row(**json.loads(line[len(MARKER) :])))
        else:
            print(line, end="", flush=True)
    return rows, proc.wait()


def table(rows: list[tuple[str, Row]]) -> str:
    """The rows as a fixed-width table."""
    header = ("benchmark", "what", "kubevol", "reference", "ratio", "target", "")
    lines = [header]
    for module, row in rows:
        lines.append((
            module, row.work, f"{row.kubevol:.4g} {row.unit}",
            f"{row.reference:.4g} {row.unit} ({row.reference_name})", f"{row.ratio:.2f}x",
            row.target, "met" if row.met else "MISSED",
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def main() -> int:
    """Run everything; 0 when every target is met and every benchmark succeeded."""
    before = load_average()
    gathered: list[tuple[str, Row]] = []
    failed = []
    for module, args, private in BENCHMARKS:
        rows, status = run(module, args, private)
        gathered += [(module, row) for row in rows]
        if status != 0:
            failed.append(f"{module} (exit {status})")
    print("\n" + table(gathered))
    print(f"\nbefore: {before}\nafter:  {load_average()}")
    print("(a shared machine: other work running at the same time slows both columns)")
    if failed:
        print(f"benchmarks that failed or missed a target: {', '.join(failed)}")
    return 0 if not failed and all(row.met for _, row in gathered) else 1


if __name__ == "__main__":
    sys.exit(main())
