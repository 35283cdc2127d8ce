"""Exponential backoff, for every caller that waits longer after each failure.

The node layer's operation executor (the kubelet's ``ExponentialBackoff``: 500 ms doubling
to 2 min 2 s) and the Nomad-style manager's registry waits and mount retries use it.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class Backoff:
    """Delays ``initial``, ``initial * factor``, ... capped at ``maximum`` (seconds)."""

    initial: float = attrs.field(validator=attrs.validators.gt(0))
    maximum: float = attrs.field(validator=attrs.validators.gt(0))
    factor: float = attrs.field(default=2.0, validator=attrs.validators.ge(1))

    def delay(self, attempt: int) -> float:
        """The delay before retry number ``attempt`` (0 for the first retry)."""
        # Past 64 doublings every sane cap is reached; stop there so the power cannot overflow.
        step = min(max(0, attempt), 64)
        return float(min(self.maximum, self.initial * self.factor**step))
