"""``kubevol completion SHELL``: the shell's completion script, generated from the very
parser that runs the commands, so it cannot fall behind a new flag.

shtab writes the script once from the argparse parser; argcomplete instead runs kubevol on
every TAB, importing every command's module each time (grpc, the kubernetes client): a
pause on each key press. So shtab. Install the script as kubectl's is installed::

    kubevol completion bash > /etc/bash_completion.d/kubevol
    kubevol completion zsh > "${fpath[1]}/_kubevol"
"""

from __future__ import annotations

import argparse
import sys

#: The shells shtab writes scripts for that kubevol offers.
SHELLS = ("bash", "zsh", "tcsh", "fish")


def script(shell: str) -> str:
    """The completion script of ``kubevol`` for ``shell``, from the whole parser."""
    import shtab

    from kubevol.cli.main import build_parser

    text: str = shtab.complete(build_parser(), shell=shell)
    return text


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(script(args.shell))
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    parser.set_defaults(func=run)
