"""kubevol.util.units: the one quantity parser and the one duration parser."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity

from kubevol.util.units import UnitError, duration_seconds, quantity_bytes, quantity_value

_QUANTITY_TEXT = st.one_of(
    st.builds(
        "".join,
        st.tuples(
            st.sampled_from(["", "-", "+"]),
            st.from_regex(r"\A(\d{1,30}(\.\d{0,8})?|\.\d{1,8})\Z"),
            st.sampled_from(["", "e3", "E-2", "e40"]),
            st.sampled_from(["", "n", "u", "m", "k", "K", "M", "G", "T", "P", "E",
                             "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "ki", "mi", "i", "B", "iB"]),
        ),
    ),
    st.text(alphabet="0123456789.eEiKMGTPkmnu+-x ", max_size=12),
)


def _client_reading(text: str) -> Decimal | None:
    try:
        return Decimal(parse_quantity(text))
    except (ValueError, ArithmeticError):
        return None


def _our_reading(text: str) -> Decimal | None:
    try:
        return quantity_value(text)
    except UnitError:
        return None


@given(_QUANTITY_TEXT)
def test_quantities_read_as_the_kubernetes_client_reads_them(text: str) -> None:
    """The same value (or the same refusal) as the client's ``parse_quantity``, which
    kubevol does not import for the cost of importing that client."""
    text = text.strip()
    if not text:
        return
    ours, theirs = _our_reading(text), _client_reading(text)
    if theirs is None or not theirs.is_finite():
        assert ours is None or not ours.is_finite() or ours == theirs
    else:
        assert ours == theirs


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
