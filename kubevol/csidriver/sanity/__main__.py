"""``python -m kubevol.csidriver.sanity``: the suite with csi-sanity's command line.

csi-sanity's flags (``--csi.endpoint``, ``--csi.mountdir``, ... also with one dash or
``=VALUE``) are translated to the suite's ``--csi-*`` options; ``--version`` prints the
suite's version; ``--help`` lists the CSI options (``--help-pytest``: pytest's own, all 400
lines of it); anything else goes to pytest as it is (``-k``, ``-x``, ``--junit-xml``)::

    python -m kubevol.csidriver.sanity --csi.endpoint unix:///run/csi.sock \\
        --csi.testvolumesize 1073741824
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence

import pytest

from kubevol.csidriver.sanity.plugin import OPTIONS, SUITE_PACKAGE, version_line

#: csi-sanity's flag (without ``--csi.``) → this suite's option, and whether it takes a value.
FLAGS: dict[str, tuple[str, bool]] = {
    "endpoint": ("--csi-endpoint", True),
    "controllerendpoint": ("--csi-controller-endpoint", True),
    "mountdir": ("--csi-mount-dir", True),
    "stagingdir": ("--csi-staging-dir", True),
    "createmountpathcmd": ("--csi-create-mount-path-cmd", True),
    "createstagingpathcmd": ("--csi-create-staging-path-cmd", True),
    "createpathcmdtimeout": ("--csi-create-path-cmd-timeout", True),
    "removemountpathcmd": ("--csi-remove-mount-path-cmd", True),
    "removestagingpathcmd": ("--csi-remove-staging-path-cmd", True),
    "removepathcmdtimeout": ("--csi-remove-path-cmd-timeout", True),
    "checkpathcmd": ("--csi-check-path-cmd", True),
    "checkpathcmdtimeout": ("--csi-check-path-cmd-timeout", True),
    "secrets": ("--csi-secrets-file", True),
    "testvolumeaccesstype": ("--csi-access-type", True),
    "testvolumesize": ("--csi-volume-size", True),
    "testvolumeexpandsize": ("--csi-volume-expand-size", True),
    "testvolumeparameters": ("--csi-params-file", True),
    "testvolumemutableparameters": ("--csi-mutable-params-file", True),
    "testsnapshotparameters": ("--csi-snapshot-params-file", True),
    "testnodevolumeattachlimit": ("--csi-test-node-volume-attach-limit", False),
    "junitfile": ("--junit-xml", True),
}

_BOOL_WORDS = {"true": True, "1": True, "t": True, "false": False, "0": False, "f": False}


def translate(argv: Sequence[str]) -> list[str]:
    """csi-sanity's arguments as pytest's; ValueError for an unknown ``--csi.`` flag or a
    flag without its value."""
    out: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        stripped = arg.lstrip("-")
        if not arg.startswith("-") or not stripped.startswith("csi."):
            out.append(arg)
            continue
        name, has_value, value = stripped[len("csi.") :].partition("=")
        if name not in FLAGS:
            raise ValueError(f"unknown flag {arg!r}; known: {', '.join(sorted(FLAGS))}")
        option, takes_value = FLAGS[name]
        if not takes_value:
            if not has_value or _BOOL_WORDS.get(value.lower(), False):
                out.append(option)
            continue
        if not has_value:
            if not args:
                raise ValueError(f"flag {arg!r} needs a value")
            value = args.pop(0)
        out.append(f"{option}={value}")
    return out


USAGE = f"""\
usage: python -m {SUITE_PACKAGE} --csi.endpoint ENDPOINT [CSI OPTIONS] [PYTEST OPTIONS]

The CSI conformance suite (csi-sanity's checks, as pytest tests) against the driver at
ENDPOINT. Give a --csi.testvolumesize the driver can hold (default: csi-sanity's 10Gi)."""


def help_text(width: int = 100) -> str:
    """``--help``: the usage, then every CSI option under its csi-sanity and its pytest
    spelling, then where the rest goes."""
    sanity_names = {option: name for name, (option, _) in FLAGS.items()}
    lines = [
        USAGE,
        "",
        "CSI options (csi-sanity's --csi.NAME VALUE, --csi.NAME=VALUE or -csi.NAME; or the",
        "suite's own --csi-NAME):",
    ]
    for option, kwargs in OPTIONS:
        name = sanity_names.get(option)
        flags = f"--csi.{name}, {option}" if name else option
        takes_value = kwargs.get("action") != "store_true"
        if takes_value:
            choices = kwargs.get("choices")
            metavar = kwargs.get("metavar") or "VALUE"
            if isinstance(choices, tuple):
                metavar = "|".join(map(str, choices))
            flags += f" {metavar}"
        lines.append(f"  {flags}")
        lines += textwrap.wrap(
            str(kwargs["help"]), width=width, initial_indent=" " * 6, subsequent_indent=" " * 6
        )
    lines += [
        "  --csi.junitfile FILE",
        "      a JUnit XML report (pytest's --junit-xml)",
        "  --version",
        "      print the suite's version",
        "",
        *textwrap.wrap(
            "Anything else goes to pytest as it is: -k EXPR (tests by name), -x (stop at the "
            "first failure), -q, --tb=short, ... (--help-pytest prints pytest's own help).",
            width=width,
        ),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; returns pytest's exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args or "-version" in args:
        print(version_line())
        return 0
    if "--help-pytest" in args:
        return int(pytest.main(["--pyargs", SUITE_PACKAGE, "--help"]))
    if {"-h", "--help", "-help"} & set(args):
        print(help_text())
        return 0
    try:
        translated = translate(args)
    except ValueError as exc:
        print(f"{SUITE_PACKAGE}: {exc}", file=sys.stderr)
        return 2
    return int(pytest.main(["--pyargs", SUITE_PACKAGE, *translated]))


if __name__ == "__main__":
    sys.exit(main())
