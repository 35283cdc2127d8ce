"""The result of measuring a directory tree: bytes on disk and inodes."""

from __future__ import annotations

import attrs


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


@attrs.frozen(kw_only=True)
class DiskUsage:
    """What a tree occupies: ``bytes`` allocated on disk and ``inodes`` in use.

    ``source`` says how it was measured: ``"walk"`` (every entry was stat'ed) or
    ``"quota"`` (read in O(1) from the directory's project quota); ``walker`` which walker
    ran (``"native"``: the C extension, ``"python"``: the fallback; ``""`` for a quota;
    provenance only: two usages with the same figures are equal whichever walker ran).
    """

    bytes: int = attrs.field(validator=_non_negative)
    inodes: int = attrs.field(validator=_non_negative)
    source: str = attrs.field(default="walk", validator=attrs.validators.in_(("walk", "quota")))
    walker: str = attrs.field(
        default="", eq=False, validator=attrs.validators.in_(("", "native", "python"))
    )
