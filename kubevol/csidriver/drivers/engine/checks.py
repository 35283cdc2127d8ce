"""Checks the controller and node services share: capabilities a volume accepts, and
resolving a capacity range to a size."""

from __future__ import annotations

from collections.abc import Iterable

from kubevol.csi import types as t
from kubevol.csidriver.drivers.engine.records import AccessKind, VolumeRecord
from kubevol.csidriver.drivers.engine.rpc import Code, fail
from kubevol.csidriver.drivers.engine.settings import DriverSettings


def capability_problem(
    settings: DriverSettings, cap: t.VolumeCapability, kind: AccessKind | None = None
) -> str | None:
    """Why this driver (or a volume of ``kind``) cannot serve ``cap``; None when it can."""
    cap_kind = AccessKind.of(cap)
    if cap_kind not in settings.kinds:
        return f"{cap_kind.value} access is not supported by {settings.name}"
    if kind is not None and cap_kind is not kind:
        return f"the volume is a {kind.value} volume, not {cap_kind.value}"
    if cap.access_mode not in settings.access_modes:
        return f"access mode {cap.access_mode.name} is not supported by {settings.name}"
    return None


def check_capability(
    settings: DriverSettings, cap: t.VolumeCapability, volume: VolumeRecord | None = None
) -> None:
    """INVALID_ARGUMENT when ``cap`` cannot be served (for ``volume``, when given)."""
    problem = capability_problem(settings, cap, None if volume is None else volume.kind)
    if problem is not None:
        fail(Code.INVALID_ARGUMENT, problem)


def kind_of(caps: Iterable[t.VolumeCapability]) -> AccessKind:
    """The one access kind all ``caps`` ask for; INVALID_ARGUMENT when they mix."""
    kinds = {AccessKind.of(c) for c in caps}
    if len(kinds) != 1:
        fail(Code.INVALID_ARGUMENT, "a volume cannot have both block and mount access")
    return kinds.pop()


def resolve_size(settings: DriverSettings, rng: t.CapacityRange | None, minimum: int = 0) -> int:
    """The size to give a new volume for ``rng``, at least ``minimum`` (a source's size).

    OUT_OF_RANGE when the range is inverted, cannot hold ``minimum`` or exceeds the
    driver's maximum volume size.
    """
    required = rng.required_bytes if rng else 0
    limit = rng.limit_bytes if rng else 0
    if limit and required > limit:
        fail(Code.OUT_OF_RANGE, f"required_bytes {required} exceeds limit_bytes {limit}")
    size = max(required, minimum) or min(settings.default_volume_size, limit or 1 << 62)
    size = max(size, minimum)
    if limit and size > limit:
        fail(Code.OUT_OF_RANGE, f"limit_bytes {limit} is smaller than the source's {minimum}")
    if size > settings.max_volume_size:
        fail(
            Code.OUT_OF_RANGE,
            f"{size} bytes exceed the maximum volume size {settings.max_volume_size}",
        )
    return size


def fits(rng: t.CapacityRange | None, capacity: int) -> bool:
    """Whether an existing volume of ``capacity`` bytes satisfies ``rng``."""
    if rng is None:
        return True
    if rng.required_bytes and capacity < rng.required_bytes:
        return False
    return not (rng.limit_bytes and capacity > rng.limit_bytes)
