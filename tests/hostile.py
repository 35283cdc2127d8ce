"""Helpers for the hostile-input tests (issue 20): a snapshot of a directory that must not
change, and a workload process that keeps swapping directories for links."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

#: The workload: exchanges each named sub-directory of a volume with a link to a target
#: outside (``renameat2(RENAME_EXCHANGE)`` through a directory descriptor, so that the name
#: never goes missing and nothing is ever written into the target), until killed.
_FLIPPER = r"""
import ctypes, os, sys
volume, target, names = sys.argv[1], sys.argv[2], sys.argv[3:]
renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
RENAME_EXCHANGE = 2
fd = os.open(volume, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
for name in names:
    os.symlink(target, name + ".link", dir_fd=fd)
print("ready", flush=True)
while True:
    for name in names:
        # Atomically: the name is always there, now a directory, now a link.
        renameat2(fd, name.encode(), fd, (name + ".link").encode(), RENAME_EXCHANGE)
"""


def snapshot(path: Path) -> dict[str, tuple[int, int, int, bytes | str]]:
    """Every entry under ``path`` (and ``path``): mode, uid, gid, and content or link target."""
    out: dict[str, tuple[int, int, int, bytes | str]] = {}
    entries = [str(path)]
    for dirpath, dirnames, filenames in os.walk(path):
        entries += [os.path.join(dirpath, n) for n in [*dirnames, *filenames]]
    for full in entries:
        st = os.lstat(full)
        if os.path.islink(full):
            body: bytes | str = os.readlink(full)
        elif os.path.isfile(full):
            body = Path(full).read_bytes()
        else:
            body = b""
        out[full] = (st.st_mode, st.st_uid, st.st_gid, body)
    return out


class LinkFlipper:
    """``with LinkFlipper(volume, target, names):`` a separate process (a workload, with no
    GIL shared with the test) flips ``names`` under ``volume`` between directory and link to
    ``target`` as fast as it can, from before the block starts until it ends."""

    def __init__(self, volume: Path, target: Path, names: list[str]) -> None:
        self.args = [sys.executable, "-c", _FLIPPER, str(volume), str(target), *names]
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> LinkFlipper:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
