"""Which build of kubevol runs: its git commit and build date.

A git checkout (an editable install) is read directly (``.git/HEAD`` and its ref, no
``git`` process); a wheel or an sdist records both at build time in
``kubevol/_buildinfo.json`` (written by ``setup.py``'s ``build_py`` and ``sdist``), since an
installed package has no checkout beside it. ``$KUBEVOL_GIT_COMMIT`` and
``$KUBEVOL_BUILD_DATE`` override both, for packagers who build outside a checkout.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

#: Set to override the git commit reported by :func:`git_commit`.
GIT_COMMIT_ENV = "KUBEVOL_GIT_COMMIT"
#: Set to override the build date reported by :func:`build_date`.
BUILD_DATE_ENV = "KUBEVOL_BUILD_DATE"
#: What a build records, in the package's directory.
BUILD_INFO_FILE = "_buildinfo.json"

#: The ``kubevol`` package's directory.
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def recorded(source_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """What the build recorded (``git_commit``, ``build_date``); ``{}`` when nothing was."""
    try:
        data = json.loads((source_dir / BUILD_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def checkout_commit(source_dir: Path = PACKAGE_DIR) -> str:
    """The HEAD commit of the git checkout holding the package directory, else ""."""
    git_dir = source_dir.parent / ".git"
    try:
        head = (git_dir / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[len("ref: "):]
        ref_file = git_dir / ref
        if ref_file.exists():
            return ref_file.read_text().strip()
        for line in (git_dir / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    except OSError:
        return ""
    return ""


def git_commit(source_dir: Path = PACKAGE_DIR) -> str:
    """The commit kubevol runs from: ``$KUBEVOL_GIT_COMMIT``, else the HEAD of the checkout
    holding the package, else the commit its build recorded, else ""."""
    from_env = os.environ.get(GIT_COMMIT_ENV, "").strip()
    if from_env:
        return from_env
    return checkout_commit(source_dir) or recorded(source_dir).get("git_commit", "")


def build_date(source_dir: Path = PACKAGE_DIR) -> str:
    """``$KUBEVOL_BUILD_DATE``, else the date its build recorded, else when the package's
    files were written (UTC, ISO 8601)."""
    from_env = os.environ.get(BUILD_DATE_ENV, "").strip()
    if from_env:
        return from_env
    stamp = recorded(source_dir).get("build_date")
    if stamp:
        return stamp
    try:
        mtime = (source_dir / "__init__.py").stat().st_mtime
    except OSError:
        return ""
    return utc_text(mtime)


def utc_text(stamp: float) -> str:
    """``stamp`` (seconds since the epoch) as ``2024-05-01T12:00:00Z``."""
    when = datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC).replace(microsecond=0)
    return when.isoformat().replace("+00:00", "Z")
