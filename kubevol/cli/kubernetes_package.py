"""The ``kubernetes`` package loaded part by part, for the command line's own process.

``import kubernetes.client`` first runs the package's ``__init__``, which imports every part
of the client library: ``config``, ``dynamic``, ``watch``, ``stream``, ``utils``,
``leaderelection`` and ``informer``, and with them requests, oauthlib, dateutil and more
(about 250 modules). Most commands use only ``kubernetes.client``'s models, and the
``config`` part only for ``--kubeconfig``: the rest cost a ``kubevol agent`` 0.15-0.18 s of
its start, before it reads a pod.

:func:`load_parts_on_use` puts the package in ``sys.modules`` without running its
``__init__``; each part is imported when first named (``kubernetes.config``, ``from
kubernetes import watch``), as module ``__getattr__`` (PEP 562) allows. Only the command
line calls it, before anything imports the package: a program that imports kubevol as a
library keeps the package as its ``__init__`` makes it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

PACKAGE = "kubernetes"


def load_parts_on_use() -> None:
    """Register the ``kubernetes`` package with its parts loaded on first use. Does
    nothing when it is already imported or not installed."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)  # its __init__ is not run

    def part(name: str) -> object:
        if name.startswith("__"):  # e.g. __version__: set by the __init__ not run
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f"{PACKAGE}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{PACKAGE}.{name}":
                raise  # the part exists but needs something missing: say so
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None

    package.__getattr__ = part  # type: ignore[method-assign]
    sys.modules[PACKAGE] = package
