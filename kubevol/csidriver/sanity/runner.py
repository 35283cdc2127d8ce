"""Run the conformance suite from a driver's own tests, and say what failed first.

The suite runs in a child process (``python -m kubevol.csidriver.sanity``) against a driver
the caller serves; its outcome comes back as a :class:`SuiteReport` read from the suite's
``--csi-report`` file, and its whole output is kept in a file next to it. A failing report
is summarised test by test: which test, the spec rule it checks (its docstring's first
sentence) and why it failed (the assertion's own message), before anything else::

    handle = serve_in_background(new_plugin(), f"unix://{tmp_path}/csi.sock", env={})
    try:
        report = run_suite(handle.address, tmp_path, volume_size=64 << 20)
    finally:
        handle.stop(grace=1)
    if not report.ok:
        pytest.fail(report.summary(), pytrace=False)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

import attrs

from kubevol.errors import KubevolError

#: What :meth:`SuiteReport.summary` lists at most, one entry each.
MAX_LISTED = 20


class SanityRunError(KubevolError, RuntimeError):
    """The suite did not run to a report (bad option, the child process died or hung)."""


@attrs.frozen(kw_only=True)
class TestOutcome:
    """One suite test's outcome: ``passed``, ``failed``, ``skipped`` or ``error`` (its set-up
    or clean-up failed)."""

    __test__ = False  # not a pytest test class, despite its name

    test: str
    outcome: str
    rule: str = ""
    reason: str = ""
    phase: str = "call"


@attrs.frozen(kw_only=True)
class SuiteReport:
    """The suite's outcomes, its exit code and where its whole output is."""

    exit_code: int
    outcomes: tuple[TestOutcome, ...]
    log_path: str

    @property
    def failures(self) -> tuple[TestOutcome, ...]:
        """The outcomes that fail the run (failed tests, failed set-ups and clean-ups)."""
        return tuple(o for o in self.outcomes if o.outcome in ("failed", "error"))

    @property
    def ok(self) -> bool:
        """Whether the run passed (pytest's exit code 0, no failure recorded)."""
        return self.exit_code == 0 and not self.failures

    def count(self, outcome: str) -> int:
        """How many tests ended with ``outcome``."""
        return len({o.test for o in self.outcomes if o.outcome == outcome})

    def summary(self) -> str:
        """What failed, first: one entry per failure (test, rule, reason), then the counts
        and where the whole output is."""
        failures = self.failures
        tests = len({o.test for o in self.outcomes})
        lines = []
        if failures:
            lines.append(
                f"CSI conformance: {len({f.test for f in failures})} of {tests} tests failed"
            )
            for failure in failures[:MAX_LISTED]:
                where = "" if failure.phase == "call" else f" (in its {failure.phase})"
                lines.append(f"- {failure.test}{where}")
                if failure.rule:
                    lines.append(f"    checks: {failure.rule}")
                lines.append(f"    failed: {failure.reason or '(no message)'}")
            if len(failures) > MAX_LISTED:
                lines.append(f"- ... and {len(failures) - MAX_LISTED} more")
        elif self.exit_code != 0:
            lines.append(f"CSI conformance: the suite exited with {self.exit_code}")
        else:
            lines.append("CSI conformance: passed")
        lines.append(
            f"{self.count('passed')} passed, {self.count('skipped')} skipped; "
            f"whole output: {self.log_path}"
        )
        if not failures and self.exit_code != 0:
            lines.append(_tail(self.log_path))
        return "\n".join(lines)


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            return "".join(log.readlines()[-lines:])
    except OSError:
        return ""


def read_report(path: str) -> tuple[TestOutcome, ...]:
    """The outcomes a ``--csi-report`` file holds (none when it is missing)."""
    outcomes = []
    try:
        with open(path, encoding="utf-8") as report:
            for line in report:
                if line.strip():
                    entry = json.loads(line)
                    outcomes.append(
                        TestOutcome(
                            test=str(entry["test"]),
                            outcome=str(entry["outcome"]),
                            rule=str(entry.get("rule", "")),
                            reason=str(entry.get("reason", "")),
                            phase=str(entry.get("phase", "call")),
                        )
                    )
    except FileNotFoundError:
        pass
    return tuple(outcomes)


def run_suite(
    endpoint: str,
    work_dir: str | os.PathLike[str],
    *,
    volume_size: int | str | None = None,
    options: Sequence[str] = (),
    timeout: float = 900,
) -> SuiteReport:
    """Run the suite against the driver at ``endpoint``; staging and target directories,
    the report and the output (``sanity.log``) go under ``work_dir``.

    ``volume_size`` is the size of test volumes (bytes, or a quantity like ``64Mi``): give
    one the driver can hold (the suite's default is csi-sanity's 10 GiB). ``options`` are
    more suite or pytest options (``-k EXPR``, ``--csi-params-file F``). Raises
    :class:`SanityRunError` when the suite does not finish within ``timeout`` seconds.
    """
    work = os.fspath(work_dir)
    os.makedirs(work, exist_ok=True)
    report = os.path.join(work, "sanity-report.jsonl")
    log = os.path.join(work, "sanity.log")
    if os.path.exists(report):
        os.unlink(report)
    cmd = [
        sys.executable, "-m", "kubevol.csidriver.sanity", "--csi.endpoint", endpoint,
        "--csi.mountdir", os.path.join(work, "mnt"),
        "--csi.stagingdir", os.path.join(work, "staging"),
        f"--csi-report={report}", "-p", "no:cacheprovider", "-q", "-rfE",
    ]  # fmt: skip
    if volume_size is not None:
        cmd += ["--csi.testvolumesize", str(volume_size)]
    cmd += list(options)
    with open(log, "w", encoding="utf-8") as out:
        try:
            proc = subprocess.run(
                cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise SanityRunError(
                f"the conformance suite did not finish in {timeout:g}s; output: {log}"
            ) from exc
    return SuiteReport(exit_code=proc.returncode, outcomes=read_report(report), log_path=log)
