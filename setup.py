"""Build hook (the project is configured in pyproject.toml): say plainly which native core
could not be built and what runs instead, rather than leaving only a compiler error."""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

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


setup(cmdclass={"build_ext": BuildExtSayingWhatIsOff})
