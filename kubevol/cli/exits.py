"""The exit codes of ``kubevol``, in one place.

A usage error (64, ``EX_USAGE`` of sysexits.h) is distinct from every gRPC status code
(0-16), so that a script can tell a typo from a driver's answer to ``kubevol csi``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from kubevol.errors import KubevolError

#: The command did what was asked.
OK = 0
#: The command ran and failed, or did not do everything it was asked (``up``, ``down``,
#: ``reconstruct --repair``: a volume not mounted or not torn down, a pod not found), or
#: (``status``, ``demo``) found a problem; the reason is on stderr and in ``-o json``.
FAILED = 1
#: ``kubevol mount-refs``: the unmount is blocked.
BLOCKED = 3
#: Everything was done but for volumes that did not answer in time (a dead server or a
#: frozen FUSE daemon below their mount point); each is named on stderr, and its state is
#: ``unresponsive`` in the output.
UNRESPONSIVE = 4
#: The command line or an input file was wrong; nothing was done.
USAGE = 64
#: A bug in kubevol (``EX_SOFTWARE``): one line says what; set :data:`DEBUG_ENV` for the
#: traceback.
INTERNAL = 70
#: Interrupted (SIGINT).
INTERRUPTED = 130
#: The reader of the output went away (``kubevol ... | head``): stopped quietly.
BROKEN_PIPE = 141

#: Set in the environment to see the traceback of an internal error.
DEBUG_ENV = "KUBEVOL_DEBUG"

EPILOG = f"""\
exit status:
  {OK:<4} success
  {FAILED:<4} the command failed or did not do all it was asked (up, down, reconstruct
       --repair: what is not done, and why, is on stderr and in -o json)
  1-16 kubevol csi: the gRPC status code the driver answered (1 CANCELLED ... 16
       UNAUTHENTICATED)
  {BLOCKED:<4} kubevol mount-refs: the unmount is blocked
  {UNRESPONSIVE:<4} status, reconstruct, metrics: done but for volumes that did not answer (a dead
       server or frozen FUSE daemon below their mount point), named on stderr
  {USAGE:<4} usage error: a bad flag, value or input file (never a gRPC code)
  {INTERNAL:<4} internal error (a bug): set {DEBUG_ENV}=1 to see the traceback
  {INTERRUPTED:<4} interrupted
  {BROKEN_PIPE:<4} the output's reader went away (e.g. | head); nothing is printed

environment:
  KUBEVOL_ROOT   the kubelet-style root of node commands (default: /var/lib/kubelet)
  CSI_ENDPOINT   the driver kubevol csi calls (default of --endpoint)
  X_CSI_SECRETS  K=V,K=V secrets kubevol csi sends (unless --secrets-file)
  KUBEVOL_DEBUG  set to show the traceback of an internal error"""


class UsageError(KubevolError, ValueError):
    """A flag's value or an input file is wrong (a missing manifest, ``--node-label foo``,
    a flag that goes with another): nothing was done. ``kubevol`` exits :data:`USAGE`."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of descriptions and epilogs (tables of exit codes, examples)."""


def report_unresponsive(volumes: Iterable[tuple[str, str]]) -> int:
    """Name on stderr each volume that did not answer (what it is, why), and return the
    exit code: :data:`~kubevol.cli.UNRESPONSIVE` when there was one, else OK."""
    hung = 0
    for what, why in volumes:
        print(f"unresponsive: {what}: {why}", file=sys.stderr)
        hung += 1
    return UNRESPONSIVE if hung else OK
