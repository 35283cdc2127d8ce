"""One line per benchmark figure, in a form ``python -m benchmarks`` collects into its table.

A benchmark prints its own details for a human, then calls :func:`emit` once per row of the
table: what was measured, kubevol's figure, the reference's figure (same unit, same run),
and the target the ratio must meet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import attrs

#: Prefix of the machine-readable lines in a benchmark's output.
MARKER = "BENCH-ROW "


@attrs.frozen(kw_only=True)
class Row:
    """One figure: ``kubevol`` against ``reference`` (both in ``unit``; lower is better
    unless ``higher_is_better``), with the target the ratio must meet."""

    work: str
    unit: str
    kubevol: float
    reference: float
    reference_name: str
    #: The ratio must not exceed this (kubevol / reference; for rates, reference / kubevol).
    max_ratio: float | None = None
    #: kubevol's own figure must not exceed this (absolute targets: "<= 1.5 s").
    max_value: float | None = None
    #: kubevol's own figure must reach this (absolute rate targets: ">= 88/s").
    min_value: float | None = None
    higher_is_better: bool = False
    note: str = ""

    @property
    def ratio(self) -> float:
        """How many times slower than the reference kubevol is (1.0 = as fast)."""
        if self.kubevol == self.reference:
            return 1.0  # also 0 against 0 (a count that must stay at none)
        if self.higher_is_better:
            return self.reference / self.kubevol if self.kubevol else float("inf")
        return self.kubevol / self.reference if self.reference else float("inf")

    @property
    def met(self) -> bool:
        """Whether every target of the row is met."""
        ok = self.max_ratio is None or self.ratio <= self.max_ratio
        if self.max_value is not None:
            ok = ok and self.kubevol <= self.max_value
        if self.min_value is not None:
            ok = ok and self.kubevol >= self.min_value
        return ok

    @property
    def target(self) -> str:
        """The targets in words."""
        parts = []
        if self.max_ratio is not None:
            parts.append(f"ratio <= {self.max_ratio:g}")
        if self.max_value is not None:
            parts.append(f"<= {self.max_value:g} {self.unit}")
        if self.min_value is not None:
            parts.append(f">= {self.min_value:g} {self.unit}")
        return " and ".join(parts) or "(information)"


def emit(row: Row) -> None:
    """Print ``row`` for a human and for the collector."""
    verdict = "met" if row.met else "MISSED"
    print(
        f"{row.work}: kubevol {row.kubevol:.4g} {row.unit}, {row.reference_name} "
        f"{row.reference:.4g} {row.unit}, ratio {row.ratio:.2f}x; target {row.target}: {verdict}"
    )
    print(MARKER + json.dumps(attrs.asdict(row)), flush=True)


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, for the record next to every figure."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} CPUs)"


def with_bytecode() -> dict[str, str]:
    """This environment for a command whose start-up is measured, as a user's machine runs
    it: without ``PYTHONDONTWRITEBYTECODE`` (set on the machines this project is built on),
    so kubevol starts from the bytecode its first run wrote instead of compiling every
    module again each time (0.25 s of an agent's start here)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wait_for_socket(path: str, server: subprocess.Popen[bytes] | None = None,
                    timeout: float = 30.0) -> None:
    """Wait until the process that serves on unix socket ``path`` (``server``, when given:
    its exit ends the wait at once) created it."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if server is not None and server.poll() is not None:
            raise SystemExit(f"the server for {path} exited with {server.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing listened on {path} within {timeout:.0f} s")
        time.sleep(0.05)


#: Set in the environment of a benchmark re-run inside its private mount namespace.
NS_MARKER = "KUBEVOL_BENCH_PRIVATE_NS"


def reexec_in_private_namespace(module: str) -> None:
    """Run ``python -m module`` (with this process's arguments) again under ``unshare -m
    --propagation private``, once: the benchmark's mounts never reach the host's namespace."""
    if os.environ.get(NS_MARKER) == "1":
        return
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark makes real mounts")
    env = {**os.environ, NS_MARKER: "1"}
    args = ["unshare", "-m", "--propagation", "private", sys.executable, "-m", module,
            *sys.argv[1:]]  # fmt: skip
    os.execvpe("unshare", args, env)


def interleaved_samples(
    contenders: dict[str, Callable[[], object]], rounds: int
) -> dict[str, list[float]]:
    """Milliseconds of each contender, run in turn ``rounds`` times (so a change in the
    machine's load hits all of them alike)."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1000)
    return samples
