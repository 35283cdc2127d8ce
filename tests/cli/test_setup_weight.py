"""Weight and set-up: every mandatory dependency is one kubevol imports; ``make demo``
installs the runtime dependencies only and runs the demo in a private mount namespace;
``make wheel`` keeps the ``build/docs/`` that ``make docs`` wrote; a quiet install names
each native core it could not build. The Makefile targets are read with ``make -n`` (a dry
run), and the commands that matter are run on scratch directories."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _dry_run(target: str) -> list[str]:
    """The commands ``make TARGET`` runs from scratch (``-B``: as if nothing were built)."""
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.splitlines()


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@pytest.mark.slow
def test_every_mandatory_dependency_is_imported_by_kubevol() -> None:
    """Each of [project].dependencies provides a module some file under kubevol/ imports
    (psutil, used only by benchmarks/, was one that none did)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    imported: set[str] = set()
    for source in (ROOT / "kubevol").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    provides: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            provides.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    unused = [
        requirement
        for requirement in project["dependencies"]
        if not provides.get(_requirement_name(requirement), set()) & imported
    ]
    assert not unused, f"mandatory but not imported under kubevol/: {unused}"
    extras = project["optional-dependencies"]
    assert any(_requirement_name(r) == "psutil" for r in extras["bench"])


def test_make_demo_installs_the_runtime_only_and_mounts_privately() -> None:
    """``make demo`` installs kubevol without the test extra, and as root runs the demo
    inside ``unshare -m --propagation private`` (as ``make test`` does)."""
    lines = _dry_run("demo")
    installs = [line for line in lines if "bin/pip install " in line and "--upgrade" not in line]
    assert installs and all("[" not in line for line in installs), installs
    demo = next(line for line in lines if line.endswith("kubevol demo"))
    if os.geteuid() == 0:
        assert demo.startswith("unshare -m --propagation private "), demo


def test_make_wheel_keeps_the_docs_that_make_docs_wrote(tmp_path: Path) -> None:
    """The clean-up ``make wheel`` runs before building empties build/ and dist/ of earlier
    builds but leaves build/docs/ alone."""
    lines = _dry_run("wheel")
    build = next(i for i, line in enumerate(lines) if "-m build" in line)
    cleanup = [
        line for line in lines[:build]
        if line.startswith(("rm ", "if ", "find ")) and ("build" in line or "dist" in line)
    ]  # fmt: skip
    assert cleanup
    for rel in ("build/docs/index.html", "build/lib/kubevol/x.py", "dist/old.whl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    for line in cleanup:
        subprocess.run(["sh", "-ec", line], cwd=tmp_path, check=True)
    assert (tmp_path / "build/docs/index.html").is_file()
    assert not (tmp_path / "build/lib").exists() and not (tmp_path / "dist/old.whl").exists()


@pytest.mark.root
def test_a_quiet_install_names_the_native_cores_it_could_not_build(tmp_path: Path) -> None:
    """The check ``make`` runs after ``pip install -q`` (which hides setup.py's notice)
    prints which native core is off, and nothing when both are built."""
    check = next(line for line in _dry_run("demo") if "find_spec" in line)
    command = check.replace(".venv/bin/python", str(ROOT / ".venv/bin/python"), 1)
    fake = tmp_path / "fake"  # a kubevol whose native modules were not built
    for package in ("kubevol", "kubevol/metrics", "kubevol/mount"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    off = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert "kubevol.metrics._duwalk" in off.stderr and "kubevol.mount._mountinfo" in off.stderr
    assert "no working C compiler" in off.stderr
    built = [
        m for m in ("kubevol.metrics._duwalk", "kubevol.mount._mountinfo")
        if importlib.util.find_spec(m) is not None
    ]  # fmt: skip
    if len(built) == 2:  # this checkout was built with a compiler
        quiet = subprocess.run(["sh", "-c", command], cwd=ROOT, capture_output=True, text=True,
                               check=True)  # fmt: skip
        assert quiet.stderr == ""
