"""Covers kubevol.testing.e2e against kubevol.csidriver.drivers.mock.

The kubelet-in-a-box suite against kubevol's bundled mock driver (issue 33: it passes
against the mock where it applies): with ``--mock`` the checks of what the kubelet sends
and the driver answers pass, every other check is skipped saying why, none fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver

pytestmark = pytest.mark.root

#: The checks that apply to a driver that mounts nothing, and pass against the mock.
MOCK_PASSES = (
    "disruptive/deleted-while-down-filesystem", "disruptive/deleted-while-down-block",
    "disruptive/unpublish-repeated-after-crash", "fsgroupchangepolicy/volume-mount-group",
    "readwriteoncepod/second-pod-refused", "volumelimits/limit-honoured",
)


def test_the_mock_driver_passes_where_the_suite_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kubevol driver e2e --mock`` against the mock (with a volume limit of 3): exit 0,
    the call-level checks pass, the others are skipped with the reason."""
    if os.geteuid() != 0:
        pytest.fail("the e2e suite needs root (real mounts)")
    with MockDriver(MockConfig(node_id="n1", attach_limit=3)).serve(
            f"unix://{tmp_path}/mock.sock") as running:
        code = main(["driver", "e2e", "--endpoint", running.endpoint, "--mock",
                     "--csi.testvolumesize", "16Mi", "--timeout", "10s"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{len(MOCK_PASSES)} passed, 0 failed" in out, out
    for name in MOCK_PASSES:
        assert f"PASSED  {name}" in out, out
    assert "SKIPPED volumes/store-data" in out
    assert "the driver is a mock (--mock)" in out
    assert "does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS" in out
