"""Build hooks (the project is configured in pyproject.toml): say plainly which native core
could not be built and what runs instead, rather than leaving only a compiler error; and
record the git commit and build date in the wheel and the sdist (kubevol/_buildinfo.json,
read by kubevol.util.buildinfo), which have no checkout beside them once installed."""

import datetime
import json
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

#: What a build records, in the package's directory (kubevol.util.buildinfo reads it).
BUILD_INFO = os.path.join("kubevol", "_buildinfo.json")

#: What each optional extension's absence means (its pure-Python twin gives the same answers).
FALLBACKS = {
    "kubevol.metrics._duwalk": "the native du walker is off and du walks in Python (slower); "
    "'kubevol metrics -o wide' shows which walker ran",
    "kubevol.mount._mountinfo": "the native mountinfo parser is off and mount tables are "
    "parsed in Python (slower)",
}


class BuildExtSayingWhatIsOff(build_ext):
    """``build_ext`` that names every optional extension it could not build."""

    def run(self) -> None:
        super().run()
        for ext in self.extensions:
            if not os.path.exists(self.get_ext_fullpath(ext.name)):
                what = FALLBACKS.get(ext.name, "its Python twin runs instead")
                print(f"kubevol: {ext.name} was not built (no working C compiler?): {what}",
                      file=sys.stderr)


def _build_info():
    """The commit of the checkout being built ($KUBEVOL_GIT_COMMIT first) and the date
    ($KUBEVOL_BUILD_DATE, else $SOURCE_DATE_EPOCH, else now); None outside a checkout."""
    commit = os.environ.get("KUBEVOL_GIT_COMMIT", "").strip()
    if not commit:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                capture_output=True, text=True, check=True, timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    date = os.environ.get("KUBEVOL_BUILD_DATE", "").strip()
    if not date:
        stamp = float(os.environ.get("SOURCE_DATE_EPOCH") or datetime.datetime.now().timestamp())
        when = datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC)
        date = when.replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return {"git_commit": commit, "build_date": date}


def _write_build_info(directory):
    info = _build_info()
    if info is None:
        return  # an sdist's own record (package data) is built in as it is
    path = os.path.join(directory, BUILD_INFO)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info, f)


class BuildPyRecordingTheCommit(build_py):
    """``build_py`` that records the commit and build date in the built package."""

    def run(self) -> None:
        super().run()
        _write_build_info(self.build_lib)


class SdistRecordingTheCommit(sdist):
    """``sdist`` that records them in the source tree it packs (a wheel built from it has
    no checkout to ask)."""

    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        _write_build_info(base_dir)


setup(cmdclass={
    "build_ext": BuildExtSayingWhatIsOff,
    "build_py": BuildPyRecordingTheCommit,
    "sdist": SdistRecordingTheCommit,
})
