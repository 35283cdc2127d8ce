"""Build the API reference (HTML, from the docstrings) into a directory, with every warning
an error: a docstring or annotation pdoc cannot read fails the build.

    python scripts/build-docs.py build/docs
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from pathlib import Path

import pdoc
import pdoc.extract

import kubevol


def public_modules() -> list[str]:
    """The fewest module specs that make pdoc document kubevol and every module below it
    whose dotted name has no ``_``-prefixed part (pdoc walks a package's submodules itself
    unless the package's ``__all__`` leaves them out)."""
    names = ["kubevol"]
    for info in pkgutil.walk_packages(kubevol.__path__, "kubevol."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    specs: list[str] = []
    covered: set[str] = set()
    for name in names:
        if name not in covered:
            specs.append(name)
            covered.update(pdoc.extract.walk_specs([name]))
    return specs


def resolve_lazy_names(names: list[str]) -> None:
    """Load what lazy packages (``kubevol``, ``kubevol.csi``) export on first use, so that pdoc,
    which reads a module's ``__dict__``, finds every name of their ``__all__``."""
    for name in names:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            if attr not in vars(module):
                setattr(module, attr, getattr(module, attr))


def main(out: str) -> int:
    warnings.simplefilter("error")
    # Annotations of third-party bases we subclass (requests.Session, ...) are theirs to fix,
    # and private members are not part of the reference (typing-only generics such as
    # weakref.finalize[...] need not evaluate at run time there).
    warnings.filterwarnings("ignore", message=r"Error parsing type annotation .* for (?!kubevol\.)")
    warnings.filterwarnings("ignore", message=r"Error parsing type annotation .* for \S*\._")
    modules = public_modules()
    resolve_lazy_names(modules)
    pdoc.render.configure(docformat="restructuredtext", show_source=False)
    pdoc.pdoc(*modules, output_directory=Path(out))
    print(f"build-docs: {len(modules)} modules documented in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/docs"))
