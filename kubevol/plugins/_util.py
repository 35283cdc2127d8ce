"""Small helpers shared by the in-tree plugins."""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

from kubevol.errors import MountError, SpecError
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


def remove_tree_on_one_device(path: str) -> None:
    """Delete ``path`` recursively, refusing (before deleting anything) if a mount is inside.

    A volume's directory may have something mounted below it; deleting through that
    mount would destroy data that is not the volume's.
    """
    root_dev = os.lstat(path).st_dev
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            sub = os.path.join(dirpath, name)
            if os.lstat(sub).st_dev != root_dev or os.path.ismount(sub):
                raise MountError(f"refusing to delete {path!r}: {sub!r} is a mount point")
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            sub = os.path.join(dirpath, name)
            if os.path.islink(sub):
                os.unlink(sub)
            else:
                os.rmdir(sub)
    os.rmdir(path)
