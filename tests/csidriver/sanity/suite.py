"""Running the conformance suite (``pytest --pyargs kubevol.csidriver.sanity``) in a child process
against a driver this test process serves, and reading its JUnit report."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs


@attrs.frozen(kw_only=True)
class SuiteResult:
    """Which suite tests passed, were skipped, failed or errored; and the output."""

    exit_code: int
    passed: frozenset[str]
    skipped: frozenset[str]
    failed: frozenset[str]
    output: str

    def describe(self) -> str:
        """A summary for assertion messages."""
        return (
            f"exit {self.exit_code}; failed {sorted(self.failed)}; "
            f"skipped {sorted(self.skipped)}\n{self.output[-4000:]}"
        )


def run_suite(endpoint: str, work: Path, *options: str, timeout: float = 300) -> SuiteResult:
    """``pytest --pyargs kubevol.csidriver.sanity --csi-endpoint ENDPOINT OPTIONS`` in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    report = work / "report.xml"
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
        f"--junit-xml={report}", "--pyargs", "kubevol.csidriver.sanity",
        "--csi-endpoint", endpoint,
        "--csi-staging-dir", str(work / "staging"), "--csi-mount-dir", str(work / "mnt"),
        *options,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=work, capture_output=True, text=True, timeout=timeout, check=False
    )
    passed, skipped, failed = set(), set(), set()
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("name", "")
            kinds = {child.tag for child in case}
            if kinds & {"failure", "error"}:
                failed.add(name)
            elif "skipped" in kinds:
                skipped.add(name)
            else:
                passed.add(name)
    return SuiteResult(
        exit_code=proc.returncode,
        passed=frozenset(passed),
        skipped=frozenset(skipped),
        failed=frozenset(failed),
        output=proc.stdout + proc.stderr,
    )
