"""Covers the test files themselves: each one says which kubevol module it covers.

A newcomer finds the tests of a module by name: ``tests/**/test_<name>.py`` covers the module
or package ``<name>`` somewhere under ``kubevol/`` (``tests/mount/test_guard.py`` covers
``kubevol/mount/guard.py``), or else the first line of its docstring names what it covers by
dotted path (``Covers kubevol.node.reconciler and kubevol.node.executor.``). The check reads
the files (``ast``) and the tree under ``kubevol/``; it imports nothing. The few files that
check the project as a whole rather than a module are listed in ``WHOLE_PROJECT``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
PACKAGE = ROOT / "kubevol"

#: Test files that cover the project as a whole, not one module, and what they cover instead.
WHOLE_PROJECT: dict[str, str] = {
    "tests/test_examples.py": "examples/library.py, the README's library example",
    "tests/test_import.py": "the root package: what ``import kubevol`` loads",
    "tests/test_layering.py": "the import graph of every kubevol module",
    "tests/test_packaging.py": "the version, the licence, the changelog, installed metadata",
    "tests/test_public_api.py": "every public package's ``__all__``",
    "tests/test_readme_commands.py": "the command lines README.md shows",
    "tests/cli/test_setup_weight.py": "the dependencies and the Makefile's targets",
    "tests/test_test_naming.py": "the test files themselves",
}

DOTTED = re.compile(r"\bkubevol(?:\.[A-Za-z_]\w*)+")


def module_names() -> set[str]:
    """The last component of every module and package under ``kubevol/``, at any depth."""
    names = {p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    return names


def names_a_module(dotted: str) -> bool:
    """Whether ``dotted`` is a module or package under ``kubevol/``, or a name in a module
    (``kubevol.testing.etcd.EtcdServer``). A name after a package does not count, so that a
    misspelt module (``kubevol.node.reconciller``) is not taken for a name in ``kubevol.node``.
    """
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        path = ROOT.joinpath(*parts[:end])
        if path.with_suffix(".py").is_file():
            return True
        if (path / "__init__.py").is_file():
            return end == len(parts)
    return False


def first_docstring_line(test_file: Path) -> str:
    """The first line of the file's module docstring, or "" when it has none."""
    docstring = ast.get_docstring(ast.parse(test_file.read_text(encoding="utf-8")))
    return docstring.splitlines()[0] if docstring else ""


def says_what_it_covers(test_file: Path, modules: set[str]) -> bool:
    """The rule: the file's name names a module or package, or its first docstring line does."""
    if test_file.stem.removeprefix("test_") in modules:
        return True
    return any(names_a_module(m) for m in DOTTED.findall(first_docstring_line(test_file)))


def test_every_test_file_names_the_module_it_covers() -> None:
    """Each ``tests/**/test_*.py`` is named after a module or package under ``kubevol/``, or
    the first line of its docstring names one by dotted path (e.g. ``Covers kubevol.x.y.``)."""
    modules = module_names()
    test_files = sorted(TESTS.rglob("test_*.py"))
    assert len(test_files) > 100  # the walk found the test tree
    unnamed = [
        str(f.relative_to(ROOT))
        for f in test_files
        if str(f.relative_to(ROOT)) not in WHOLE_PROJECT and not says_what_it_covers(f, modules)
    ]
    assert not unnamed, (
        "name the module these test files cover in the first line of their docstring, by "
        "dotted path (e.g. 'Covers kubevol.node.reconciler.'), or name the file after it: "
        + ", ".join(unnamed)
    )


def test_whole_project_list_is_current() -> None:
    """Every file listed as covering the whole project exists and needs the listing."""
    modules = module_names()
    for name in WHOLE_PROJECT:
        test_file = ROOT / name
        assert test_file.is_file(), f"{name} is listed in WHOLE_PROJECT but does not exist"
        assert not says_what_it_covers(test_file, modules), (
            f"{name} names a kubevol module: take it out of WHOLE_PROJECT"
        )


def test_the_rule_on_examples() -> None:
    """Modules, packages and names in modules count; a misspelt module or prose does not."""
    assert names_a_module("kubevol.mount.guard")
    assert names_a_module("kubevol.csidriver.server")
    assert names_a_module("kubevol.testing.etcd.EtcdServer")
    assert not names_a_module("kubevol.node.reconciller")
    assert not names_a_module("kubevol.nowhere")
    modules = module_names()
    assert {"guard", "mount", "reconciler", "hostpath", "csi"} <= modules
    assert "kubevol" not in modules
