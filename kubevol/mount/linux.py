"""The real mounter: mount(2)/umount2(2) where the kernel call is all it takes (binds,
remounts, tmpfs), mount(8) and umount(8) where their helpers matter, the kernel's mount
table and statx for answers."""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import functools
import logging
import os
import posixpath
import subprocess
from collections.abc import Sequence
from contextlib import nullcontext

from kubevol.errors import MountError
from kubevol.mount import syscalls
from kubevol.mount.helpers import get_mount_refs
from kubevol.mount.interface import MountInterface, MountPoint
from kubevol.mount.mountread import PROC_MOUNTINFO
from kubevol.mount.table import MountTable, MountTableCache
from kubevol.util import clib
from kubevol.util.lifecycle import Around

log = logging.getLogger(__name__)

#: What replaces a sensitive option wherever a command line is shown.
MASKED = "<masked>"

#: umount(8)'s message for a target that is not a mount point (util-linux, which the
#: kubelet's "safe not-mounted behaviour" also relies on).
_NOT_MOUNTED = "not mounted"
#: Where umount(8) looks for ``umount.<type>`` helpers.
_HELPER_DIRS = ("/sbin", "/usr/sbin", "/bin", "/usr/bin")

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_NO_AUTOMOUNT = 0x800
_AT_STATX_DONT_SYNC = 0x4000
_STATX_ATTR_MOUNT_ROOT = 0x2000
_STATX_SIZE = 256
#: Byte offsets in ``struct statx`` (include/uapi/linux/stat.h).
_STX_ATTRIBUTES = 8
_STX_ATTRIBUTES_MASK = 56


class LinuxMounter(MountInterface):
    """Mounts with mount(2) or ``mount`` (see the module docstring) and reads
    ``mountinfo_path`` for the mount table.

    The table is cached and re-read only when the kernel reports a change, so repeated
    questions on a busy node stay cheap. Thread-safe.
    """

    def __init__(
        self, mountinfo_path: str = PROC_MOUNTINFO, *, around_helper: Around = nullcontext
    ) -> None:
        self.mountinfo_path = mountinfo_path
        self._table = MountTableCache(mountinfo_path)
        #: Wraps each wait on a ``mount``/``umount`` process: a helper may take seconds (a
        #: network mount), so the node layer lets its other operations run meanwhile
        #: (:func:`kubevol.util.turns.given_up`).
        self._around_helper = around_helper

    def close(self) -> None:
        """Release the open mount table descriptor. Idempotent; the mounter stays usable."""
        self._table.close()

    def table(self, *, superset: bool = False, at: str | None = None) -> MountTable:
        """The mount table as it is now: read again only after the kernel reported a
        change, so every question of one operation shares one reading (see
        :meth:`MountInterface.table`)."""
        return self._table.table(superset=superset, at=at)

    def removing_mount_point(self, path: str) -> contextlib.AbstractContextManager[None]:
        """See :meth:`MountInterface.removing_mount_point`: the table kept for checks that
        accept a superset leaves ``path`` out once it is removed."""
        return self._table.removing(path)

    def mount(
        self, source: str, target: str, fstype: str = "", options: Sequence[str] = ()
    ) -> None:
        """Mount ``source`` at ``target``; see :meth:`MountInterface.mount`. Raises
        :class:`~kubevol.errors.MountError` naming the command and its output."""
        self.mount_sensitive(source, target, fstype, options, ())

    def mount_sensitive(
        self,
        source: str,
        target: str,
        fstype: str,
        options: Sequence[str],
        sensitive_options: Sequence[str],
    ) -> None:
        """Mount like :meth:`mount`; ``sensitive_options`` appear as ``<masked>`` in logs and
        errors, and are scrubbed from the command's output before it is shown."""
        options = list(options)
        call = None if sensitive_options else syscalls.mount_call(fstype, options)
        if call is not None:
            self._mount_directly(source, target, fstype, options, call)
            return
        if "bind" in options and any(o not in ("bind", "remount") for o in options):
            # Flags such as ro are ignored by the kernel on the bind itself; they take
            # effect only on a remount of the bind.
            others = [o for o in options if o not in ("bind", "remount")]
            self._run_mount(source, target, fstype, ["bind"], sensitive_options)
            try:
                self._run_mount(source, target, fstype, ["bind", "remount", *others], ())
            except MountError:
                # Leave nothing half-done: a bind without its flags (say, writable instead
                # of read-only) must not stay behind.
                self._unmount_quietly(target)
                raise
            return
        self._run_mount(source, target, fstype, options, sensitive_options)

    def unmount(self, target: str) -> None:
        """Unmount ``target``: umount2(2), or umount(8) when the filesystem has an
        ``umount.<type>`` helper here. Idempotent like the kubelet's (which trusts
        util-linux's "not mounted"): a target that is not a mount point is success, since a
        concurrent tear-down or a retry after a failed check got there first. Raises
        :class:`~kubevol.errors.MountError` otherwise, including for a missing path."""
        log.debug("unmounting %s", target)
        if self._has_umount_helper(target):
            self._run_umount(target)
            return
        try:
            if not syscalls.umount(target):
                log.debug("%s was not mounted", target)
        except OSError as exc:
            raise MountError(
                exc.errno, f"unmount failed: {exc.strerror}; unmounting arguments: {target}"
            ) from exc

    def _has_umount_helper(self, target: str) -> bool:
        helpers = _umount_helpers()
        if not helpers:
            return False
        # Which filesystem is mounted there: a table that may still list mounts detached
        # since it was read is good enough (a helper run on a path no longer mounted says
        # so), and is kept while mounts only go: a tear-down of many volumes reads the
        # table once, not once per unmount (umount.nfs is on many nodes).
        real = os.path.realpath(target)
        entry = self.table(superset=True, at=real).find_mount_point(real)
        return entry is not None and (
            entry.fs_type in helpers or entry.fs_type.partition(".")[0] in helpers
        )

    def _run_umount(self, target: str) -> None:
        result = _run(["umount", target], self._around_helper)
        if result.returncode != 0:
            if _NOT_MOUNTED in result.stderr:
                log.debug("%s was not mounted", target)
                return
            raise MountError(
                f"unmount failed: exit status {result.returncode}; "
                f"unmounting arguments: {target}; output: {result.stderr.strip()}"
            )

    def list(self) -> builtins.list[MountPoint]:
        """Every entry of the mount table, in table order."""
        return [
            MountPoint(device=e.source, path=e.mount_point, type=e.fs_type, opts=e.options)
            for e in self._table.table().entries()
        ]

    def is_mount_point(self, path: str) -> bool:
        """Exact check (after resolving symlinks): statx ``STATX_ATTR_MOUNT_ROOT``, which
        sees bind mounts and costs one syscall however many mounts the node has; the mount
        table where statx cannot tell or the path cannot be looked at (missing, corrupted)."""
        real = os.path.realpath(path)
        mount_root = None
        if self.mountinfo_path == PROC_MOUNTINFO:  # statx sees this process's namespace
            with contextlib.suppress(OSError):
                mount_root = _statx_mount_root(real)
        if mount_root is not None:
            return mount_root
        return self._table.table().find_mount_point(real) is not None

    def is_likely_not_mount_point(self, path: str) -> bool:
        """True when ``path`` is not the root of a mount (statx ``STATX_ATTR_MOUNT_ROOT``).

        Where the kernel does not report that attribute, compares the device number with
        the parent directory's, which misses bind mounts inside one filesystem. Raises
        ``FileNotFoundError`` for a missing path and other ``OSError`` (ENOTCONN, ...) as
        they come.
        """
        mount_root = _statx_mount_root(path)
        if mount_root is not None:
            return not mount_root
        st = os.stat(path)
        parent = os.stat(posixpath.dirname(path.rstrip("/")) or "/")
        return st.st_dev == parent.st_dev

    def get_mount_refs(self, path: str) -> builtins.list[str]:
        """Kubernetes' ``GetMountRefs``; see :func:`kubevol.mount.helpers.get_mount_refs`."""
        return get_mount_refs(path, cache=self._table)

    def _run_mount(
        self,
        source: str,
        target: str,
        fstype: str,
        options: Sequence[str],
        sensitive: Sequence[str],
    ) -> None:
        args = ["mount"]
        shown = ["mount"]
        if fstype:
            args += ["-t", fstype]
            shown += ["-t", fstype]
        if options or sensitive:
            args += ["-o", ",".join([*options, *sensitive])]
            shown += ["-o", ",".join([*options, *(MASKED for _ in sensitive)])]
        args += [source, target]
        shown += [source, target]
        log.debug("mounting: %s", " ".join(shown))
        result = _run(args, self._around_helper)
        if result.returncode != 0:
            output = _scrub(result.stderr.strip(), sensitive)
            raise MountError(
                f"mount failed: exit status {result.returncode}; "
                f"mounting command: {' '.join(shown)}; output: {output}"
            )

    def _mount_directly(
        self, source: str, target: str, fstype: str, options: Sequence[str],
        call: syscalls.MountCall,
    ) -> None:
        shown = f"{source} {target} type {fstype or 'none'} options {','.join(options)}"
        log.debug("mounting (mount(2)): %s", shown)
        try:
            if call.bind:
                syscalls.bind(source, target, call)
            else:
                syscalls.mount(source, target, fstype, call.flags, call.data)
        except OSError as exc:
            raise MountError(
                exc.errno, f"mount failed: {exc.strerror}; mounting arguments: {shown}"
            ) from exc

    def _unmount_quietly(self, target: str) -> None:
        try:
            self.unmount(target)
        except MountError as exc:
            log.warning("could not undo the bind mount at %s: %s", target, exc)


def _run(args: Sequence[str], around: Around) -> subprocess.CompletedProcess[str]:
    try:
        with around():
            return subprocess.run(args, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise MountError(exc.errno, f"cannot run {args[0]}: {exc.strerror}") from exc


def _scrub(text: str, sensitive: Sequence[str]) -> str:
    for secret in sensitive:
        if secret:
            text = text.replace(secret, MASKED)
    return text


@functools.cache  # the helpers installed on the node: looked up once, like an import
def _umount_helpers() -> frozenset[str]:
    """Filesystem types with an ``umount.<type>`` helper that umount(8) would run."""
    found = set()
    for directory in _HELPER_DIRS:
        with contextlib.suppress(OSError):
            for name in os.listdir(directory):
                if name.startswith("umount."):
                    found.add(name[len("umount.") :])
    return frozenset(found)


def _statx_mount_root(path: str) -> bool | None:
    """Whether ``path`` is a mount root per statx, or None when the kernel cannot say.

    Raises ``OSError`` (``FileNotFoundError``, ENOTCONN, ...) when statx fails on the path.
    """
    try:
        statx = clib.libc().statx
    except AttributeError:  # a libc without statx: fall back to device numbers
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    flags = _AT_STATX_DONT_SYNC | _AT_SYMLINK_NOFOLLOW | _AT_NO_AUTOMOUNT
    rc = statx(_AT_FDCWD, os.fsencode(path), flags, 0, buf)
    if rc != 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:  # a kernel older than statx
            return None
        raise OSError(err, os.strerror(err), path)
    # Both fields are native-endian __u64: read in place, not from copies of the buffer.
    mask = ctypes.c_uint64.from_buffer(buf, _STX_ATTRIBUTES_MASK).value
    if not mask & _STATX_ATTR_MOUNT_ROOT:
        return None
    attrs = ctypes.c_uint64.from_buffer(buf, _STX_ATTRIBUTES).value
    return bool(attrs & _STATX_ATTR_MOUNT_ROOT)
