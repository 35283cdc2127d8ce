"""``python -m kubevol.csidriver.sanity``: the suite with csi-sanity's command line.

csi-sanity's flags (``--csi.endpoint``, ``--csi.mountdir``, ... also with one dash or
``=VALUE``) are translated to the suite's ``--csi-*`` options; ``--version`` prints the
suite's version; anything else goes to pytest as it is (``-k``, ``-x``, ``--junit-xml``)::

    python -m kubevol.csidriver.sanity --csi.endpoint unix:///run/csi.sock \\
        --csi.testvolumesize 1073741824
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest

from kubevol.csidriver.sanity.plugin import SUITE_PACKAGE, version_line

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; returns pytest's exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args or "-version" in args:
        print(version_line())
        return 0
    try:
        translated = translate(args)
    except ValueError as exc:
        print(f"{SUITE_PACKAGE}: {exc}", file=sys.stderr)
        return 2
    return int(pytest.main(["--pyargs", SUITE_PACKAGE, *translated]))


if __name__ == "__main__":
    sys.exit(main())
