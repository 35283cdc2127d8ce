"""Write kubevol's man page, kubevol(1), from the command's own parser (argparse-manpage):
``python scripts/make-man.py build/man/kubevol.1``; ``man -l build/man/kubevol.1`` shows it.
Generated, so that it never disagrees with ``--help``."""

from __future__ import annotations

import sys
from pathlib import Path

from argparse_manpage.manpage import Manpage

from kubevol.cli.main import build_parser


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: make-man.py OUTPUT", file=sys.stderr)
        return 64
    out = Path(sys.argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(str(Manpage(build_parser())), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
