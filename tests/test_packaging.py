"""Packaging basics a user relies on: one version, the licence text, the changelog, the
classifiers and extras in the installed metadata."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import kubevol

REPO = Path(__file__).resolve().parents[1]


def test_one_version_source() -> None:
    """The installed distribution's version is kubevol.__version__ (pyproject reads it)."""
    assert importlib.metadata.version("kubevol") == kubevol.__version__
    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text(encoding="utf-8")


def test_licence_is_the_full_apache_text_and_ships() -> None:
    """LICENSE holds the whole Apache-2.0 text, and the metadata names it."""
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and text.count("\n") > 190
    meta = importlib.metadata.metadata("kubevol")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])


def test_metadata_has_classifiers_extras_and_no_mandatory_etcd() -> None:
    """Classifiers name the Pythons CI tests; etcd3gw is only in the 'etcd' extra."""
    meta = importlib.metadata.metadata("kubevol")
    classifiers = meta.get_all("Classifier") or []
    for version in ("3.11", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Typing :: Typed" in classifiers
    requires = meta.get_all("Requires-Dist") or []
    mandatory = [r for r in requires if "extra ==" not in r]
    assert not [r for r in mandatory if r.startswith(("etcd3gw", "futurist", "pbr"))]
    assert any(r.startswith("etcd3gw") and 'extra == "etcd"' in r for r in requires)


def test_changelog_has_an_unreleased_section() -> None:
    """CHANGELOG.md lists what changed since the last version."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in text and f"## [{kubevol.__version__}]" in text


def test_wheel_data_includes_stubs_manifests_and_protos() -> None:
    """The package data globs ship py.typed, the .pyi stubs, the protos and the examples."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    for glob in ('"py.typed"', '"**/*.pyi"', '"**/*.proto"', '"**/*.yaml"'):
        assert glob in text
    assert list((REPO / "kubevol" / "examples").glob("*.yaml"))
