"""kubevol.units: the one quantity parser and the one duration parser."""

from __future__ import annotations

import pytest

from kubevol.units import UnitError, duration_seconds, quantity_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1 << 30),
        ("64Mi", 64 << 20),
        ("1.5Gi", 3 << 29),
        ("10G", 10**10),
        ("1e3", 1000),
        ("1k", 1000),
        ("0.5", 1),  # rounded up, as resource.Quantity.Value() does
        ("100m", 1),
        (2048, 2048),
    ],
)
def test_quantities_are_kubernetes_quantities_rounded_up(text: str, expected: int) -> None:
    """Kubernetes quantities in every suffix family, whole bytes rounded up."""
    assert quantity_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "ten", "1GB", "512MiB", "-1Gi", "NaN", "Infinity", "1ki"])
def test_bad_quantities_are_refused_naming_the_text(text: str) -> None:
    """Anything but a finite, non-negative quantity is a UnitError (a ValueError)."""
    with pytest.raises(UnitError, match=repr(text)) as info:
        quantity_bytes(text)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("2h", 7200.0),
        ("1.5h", 5400.0),
        ("300us", 300e-6),
        ("0", 0.0),
        ("30", 30.0),
        ("2.5", 2.5),
        (" 3s ", 3.0),
    ],
)
def test_durations_are_go_durations_or_seconds(text: str, seconds: float) -> None:
    """Go durations (through durationpy) and plain numbers of seconds."""
    assert duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "10 seconds", "1x", "--1s", "1s2", "ten", "-1s"])
def test_bad_durations_are_refused(text: str) -> None:
    """Garbage, and negative durations unless allowed, are UnitErrors."""
    with pytest.raises(UnitError):
        duration_seconds(text)


def test_negative_durations_when_allowed() -> None:
    """allow_negative lets a caller give '-1s' its own meaning."""
    assert duration_seconds("-1s", allow_negative=True) == -1.0
