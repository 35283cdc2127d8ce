"""Loop devices over image files, through losetup(8)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from kubevol.errors import MountError


def _losetup(*args: str) -> str:
    try:
        result = subprocess.run(["losetup", *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise MountError(exc.errno, f"cannot run losetup: {exc.strerror}") from exc
    if result.returncode != 0:
        raise MountError(
            f"losetup {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


def devices_for(image: str) -> list[str]:
    """The loop devices backed by ``image`` (``losetup -j``), in losetup's order."""
    out = _losetup("--list", "--noheadings", "--output", "NAME", "--associated", image)
    return [line.strip() for line in out.splitlines() if line.strip()]


def attach(image: str, *, read_only: bool = False) -> str:
    """Attach ``image`` to a free loop device and return the device path."""
    args: Sequence[str] = ("--find", "--show", *(("--read-only",) if read_only else ()), image)
    dev = _losetup(*args).strip()
    if not dev.startswith("/dev/"):
        raise MountError(f"losetup attached {image} but printed {dev!r}")
    return dev


def attach_once(image: str) -> str:
    """The loop device backing ``image``, attaching one if there is none. Not atomic: the
    caller serialises calls for one image."""
    existing = devices_for(image)
    return existing[0] if existing else attach(image)


def detach(device: str) -> None:
    """Detach ``device`` (``losetup -d``). A device still mounted is detached by the kernel
    when its last user goes away."""
    _losetup("--detach", device)


def refresh_size(device: str) -> None:
    """Make ``device`` re-read the size of its backing file (``losetup -c``)."""
    _losetup("--set-capacity", device)


def is_read_only(device: str) -> bool:
    """Whether loop device ``device`` was attached read-only (``/sys/block/loopN/ro``)."""
    name = os.path.basename(device)
    try:
        with open(f"/sys/block/{name}/ro", encoding="ascii") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def device_size(device: str) -> int:
    """The size of block device ``device`` in bytes."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def device_number(device: str) -> tuple[int, int]:
    """``(major, minor)`` of block device ``device``."""
    rdev = os.stat(device).st_rdev
    return os.major(rdev), os.minor(rdev)
