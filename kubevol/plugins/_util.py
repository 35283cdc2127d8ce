"""Small helpers shared by the in-tree plugins."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubevol.errors import SpecError
from kubevol.host import validate_path_segment


def pod_uid(pod: Any) -> str:
    """The validated UID of a ``V1Pod``; raises SpecError when it has none."""
    uid = getattr(getattr(pod, "metadata", None), "uid", None)
    if not uid:
        raise SpecError("the pod has no metadata.uid; kubevol needs it to lay out its volumes")
    return validate_path_segment(str(uid), "pod UID")


def quantity_bytes(quantity: Any) -> int | None:
    """A Kubernetes quantity (``"64Mi"``, ``1G``) as whole bytes, rounded up; None stays None."""
    if quantity is None or quantity == "":
        return None
    from kubernetes.utils import parse_quantity

    try:
        value = Decimal(parse_quantity(quantity))
    except ValueError as exc:
        raise SpecError(f"{quantity!r} is not a valid quantity: {exc}") from exc
    return int(value.to_integral_value(rounding="ROUND_CEILING"))
