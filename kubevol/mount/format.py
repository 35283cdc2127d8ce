"""Formatting a block device only when it is blank, and checking it before mounting it
writable (Kubernetes' ``SafeFormatAndMount``)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence

from kubevol.errors import (
    FilesystemErrorsError,
    FilesystemMismatchError,
    MountError,
    UnformattedReadOnlyError,
)
from kubevol.mount.interface import MountInterface

log = logging.getLogger(__name__)

#: Runs a command and returns its result; injectable so tests can script exit codes.
Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]

DEFAULT_FS_TYPE = "ext4"
#: What :meth:`SafeFormatAndMount.get_disk_format` reports for a partitioned disk, so that
#: it is never formatted.
PARTITIONED = "unknown data, probably partitions"

_BLKID_NOTHING_FOUND = 2
_FSCK_ERRORS_CORRECTED = 1
_FSCK_ERRORS_UNCORRECTED = 4


def run_command(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``args`` capturing text output; a missing program raises
    :class:`~kubevol.errors.MountError`."""
    try:
        return subprocess.run(list(args), capture_output=True, text=True, check=False)
    except OSError as exc:
        raise MountError(exc.errno, f"cannot run {args[0]}: {exc.strerror}") from exc


class SafeFormatAndMount:
    """Mount a block device, formatting it first only if ``blkid`` finds nothing on it.

    A device already holding a filesystem is never formatted; before a read-write mount it
    is checked with ``fsck -a``.
    """

    def __init__(self, mounter: MountInterface, *, run: Runner = run_command) -> None:
        self.mounter = mounter
        self._run = run

    def get_disk_format(self, device: str) -> str:
        """The filesystem type on ``device``; ``""`` when blank, :data:`PARTITIONED` when it
        holds a partition table. Raises :class:`~kubevol.errors.MountError` if blkid fails."""
        args = ["blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", device]
        result = self._run(args)
        if result.returncode == _BLKID_NOTHING_FOUND:
            return ""
        if result.returncode != 0:
            raise MountError(
                f"cannot tell whether {device} is formatted: blkid exit status "
                f"{result.returncode}: {result.stderr.strip()}"
            )
        values = {}
        for line in result.stdout.splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                raise MountError(f"blkid printed unexpected output for {device}: {line!r}")
            values[key] = value
        if values.get("PTTYPE"):
            return PARTITIONED
        return values.get("TYPE", "")

    def format_and_mount(
        self,
        source: str,
        target: str,
        fstype: str = "",
        options: Sequence[str] = (),
        *,
        format_options: Sequence[str] = (),
        sensitive_options: Sequence[str] = (),
    ) -> None:
        """Mount ``source`` at ``target`` as ``fstype`` (default ext4 when formatting).

        Raises :class:`~kubevol.errors.UnformattedReadOnlyError` for a blank device and a
        read-only mount (``ro`` in ``options``), :class:`~kubevol.errors.FilesystemMismatchError`
        when the device holds another filesystem (or partitions),
        :class:`~kubevol.errors.FilesystemErrorsError` when fsck leaves errors, and
        :class:`~kubevol.errors.MountError` when mkfs or the mount fails. Nothing is
        formatted unless the device is blank.
        """
        read_only = "ro" in options
        existing = self.get_disk_format(source)
        if not existing:
            if read_only:
                raise UnformattedReadOnlyError(
                    f"cannot mount unformatted device {source} read-only at {target}"
                )
            fstype = fstype or DEFAULT_FS_TYPE
            self._format(source, fstype, format_options)
        else:
            if fstype and fstype != existing:
                raise FilesystemMismatchError(
                    f"device {source} holds {existing!r}, not the requested {fstype!r}; "
                    "not formatting it"
                )
            fstype = existing
            if not read_only:
                self._check(source)
        self.mounter.mount_sensitive(source, target, fstype, options, sensitive_options)

    def _format(self, source: str, fstype: str, format_options: Sequence[str]) -> None:
        args = [f"mkfs.{fstype}"]
        if fstype in ("ext3", "ext4"):
            args += ["-F", "-m0"]  # -F: no prompt on a whole device; -m0: no reserved blocks
        args += [*format_options, source]
        log.info("formatting blank device %s as %s", source, fstype)
        result = self._run(args)
        if result.returncode != 0:
            raise MountError(
                f"formatting {source} as {fstype} failed: exit status {result.returncode}: "
                f"{result.stderr.strip()}"
            )

    def _check(self, source: str) -> None:
        result = self._run(["fsck", "-a", source])
        if result.returncode == 0:
            return
        if result.returncode == _FSCK_ERRORS_CORRECTED:
            log.warning("fsck corrected errors on %s", source)
            return
        if result.returncode == _FSCK_ERRORS_UNCORRECTED:
            raise FilesystemErrorsError(
                f"{source} has filesystem errors fsck could not repair: {result.stdout.strip()}"
                f" {result.stderr.strip()}".rstrip()
            )
        # Kubernetes carries on here too: fsck may not know the filesystem.
        log.warning("fsck of %s exited %d; mounting anyway", source, result.returncode)
