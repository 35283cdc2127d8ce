"""Covers kubevol.csidriver.server.bootstrap: ``kubevol driver new``.

``kubevol driver new NAME`` writes a driver project that installs into a fresh virtual
environment and passes the conformance suite with its own test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.csidriver.server.bootstrap import BootstrapError, render, write_project

ROOT = Path(__file__).resolve().parents[3]

#: What a copy of kubevol's source for ``pip install`` leaves out.
_NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache",
    ".pytest_cache", "build", "*.so",
)  # fmt: skip


def test_new_writes_the_project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command writes package, services, provider, console script, README and test,
    naming the driver as asked; it prints what it wrote."""
    dest = tmp_path / "acme"
    code = main(["driver", "new", "acme-csi", "--output", str(dest),
                 "--driver-name", "acme.csi.example.org"])  # fmt: skip
    assert code == 0
    files = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert {
        "pyproject.toml", "README.md", "tests/test_sanity.py", "acme_csi/__init__.py",
        "acme_csi/identity.py", "acme_csi/controller.py", "acme_csi/node.py",
        "acme_csi/provider.py", "acme_csi/main.py", "acme_csi/state.py",
    } <= files  # fmt: skip
    assert 'acme-csi = "acme_csi.main:main"' in (dest / "pyproject.toml").read_text()
    assert 'DRIVER_NAME = "acme.csi.example.org"' in (dest / "acme_csi/__init__.py").read_text()
    assert str(dest / "pyproject.toml") in capsys.readouterr().out
    for rel, text in render("acme-csi", "acme.csi.example.org").items():
        if rel.endswith(".py"):
            compile(text, rel, "exec")  # every generated module is valid Python


@pytest.mark.parametrize("name", ["Acme", "1acme", "acme_csi", "acme--csi", "acme-", ""])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    """A name that is not lowercase, dash-separated and starting with a letter is refused
    before anything is written (exit 64 from the CLI)."""
    with pytest.raises(BootstrapError):
        write_project(name, str(tmp_path / "p"))
    assert not (tmp_path / "p").exists()
    assert main(["driver", "new", name or "-", "--output", str(tmp_path / "q")]) != 0


def test_an_occupied_directory_is_refused(tmp_path: Path) -> None:
    """A directory that holds anything is never written into."""
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(BootstrapError, match="not an empty directory"):
        write_project("acme-csi", str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]


@pytest.mark.root
def test_generated_project_installs_and_passes_in_a_fresh_venv(tmp_path: Path) -> None:
    """Generated, installed with pip into a new virtual environment (kubevol from this
    source tree, the rest from the package index), the project's own test -- the
    conformance suite against the driver -- passes, and its console script lists the
    environment."""
    project = tmp_path / "acme-csi"
    write_project("acme-csi", str(project))
    source = tmp_path / "kubevol-src"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         str(source), f"{project}[test]"],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CSI_"))}
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project, env=clean_env, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    usage = subprocess.run(
        [str(env_dir / "bin" / "acme-csi"), "--help"],
        env=clean_env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert usage.returncode == 0 and "X_CSI_SPEC_REQ_VALIDATION" in usage.stdout
    where = subprocess.run(
        [str(python), "-c", "import kubevol, acme_csi; print(kubevol.__file__)"],
        cwd=tmp_path, env=clean_env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(env_dir)) and not where.startswith(sys.prefix)
