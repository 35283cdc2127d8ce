"""Sizes and durations written as text: the one parser of each.

- Sizes are Kubernetes quantities (``1073741824``, ``64Mi``, ``1.5Gi``, ``10G``, ``1e9``),
  read as the ``kubernetes`` client's ``parse_quantity`` reads them (a test holds the two
  equal; importing that client costs more than loading 500 manifests) and
  rounded **up** to whole bytes, as ``resource.Quantity.Value()`` rounds.
- Durations are Go durations (``1m30s``, ``500ms``, ``2h``), read by ``durationpy`` (the
  ``kubernetes`` client's own dependency), or a plain number of seconds (``30``, ``1.5``).

Both raise :class:`UnitError` (a ``ValueError``) naming the bad text.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal

from kubevol.errors import KubevolError

#: Whole numbers of bytes need no suffix handling.
_DIGITS = re.compile(r"\d+")
#: A quantity's suffix → (base, power): binary ``Ki``…``Ei`` in powers of 1024, decimal SI
#: ``n u m k M G T P E`` (``K`` accepted for ``k``) in powers of 1000. What is left of the
#: text is a decimal number (an exponent like ``1e3`` included).
_BINARY_SUFFIXES = {p + "i": (1024, n) for n, p in enumerate("KMGTPE", start=1)}
_DECIMAL_SUFFIXES = {
    "n": (1000, -3), "u": (1000, -2), "m": (1000, -1), "k": (1000, 1), "K": (1000, 1),
    "M": (1000, 2), "G": (1000, 3), "T": (1000, 4), "P": (1000, 5), "E": (1000, 6),
}  # fmt: skip
_PLAIN_SECONDS = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")

QUANTITY_EXAMPLES = "1073741824, 64Mi, 1.5Gi, 10G"
DURATION_EXAMPLES = "30s, 1m30s, 500ms, 2h, or 30 for seconds"


class UnitError(KubevolError, ValueError):
    """A size or duration that cannot be read; the message names the text."""


def quantity_value(quantity: object) -> Decimal:
    """A Kubernetes quantity (text or number) exactly (``250m`` → ``0.25``), for callers
    that round their own way (CPU in millicores); refuses what is not a quantity."""
    text = str(quantity).strip()
    if _DIGITS.fullmatch(text):
        return Decimal(text)
    number, scale = text, None
    if text[-2:] in _BINARY_SUFFIXES:
        number, scale = text[:-2], _BINARY_SUFFIXES[text[-2:]]
    elif text[-1:] in _DECIMAL_SUFFIXES:
        number, scale = text[:-1], _DECIMAL_SUFFIXES[text[-1:]]
    try:
        # decimal's errors (invalid text, overflow) are ArithmeticErrors.
        value = Decimal(number)
        if scale is None:
            return value
        base, power = scale
        return value * Decimal(base) ** Decimal(power)
    except ArithmeticError as exc:
        raise UnitError(f"{text!r} is not a quantity (like {QUANTITY_EXAMPLES})") from exc


def quantity_bytes(quantity: object) -> int:
    """A Kubernetes quantity (text or number) as whole bytes, rounded up; refuses negative,
    infinite and not-a-number values."""
    text = str(quantity).strip()
    if _DIGITS.fullmatch(text):
        return int(text)
    value = quantity_value(text)
    if not value.is_finite() or value < 0:
        raise UnitError(f"{text!r} is not a quantity of bytes (it must be finite, >= 0)")
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def duration_seconds(text: str, *, allow_negative: bool = False) -> float:
    """A Go duration (or a plain number of seconds) as seconds; negative durations are
    refused unless ``allow_negative``."""
    value = text.strip()
    if _PLAIN_SECONDS.fullmatch(value):
        seconds = float(value)
    else:
        import durationpy

        try:
            seconds = durationpy.from_str(value).total_seconds()
        except (ValueError, OverflowError) as exc:
            raise UnitError(f"{text!r} is not a duration (like {DURATION_EXAMPLES})") from exc
    if not math.isfinite(seconds) or (seconds < 0 and not allow_negative):
        raise UnitError(f"{text!r} is not a duration of zero or more")
    return seconds
