"""Unmounting a mount whose server or daemon does not answer, by mount-utils' policy.

A plain unmount of a dead network or FUSE mount fails (``EBUSY``: the calls stuck below it
hold it) or blocks; mount-utils' ``UnmountWithForce`` then asks the filesystem to abort its
pending requests (``MNT_FORCE``), and a lazy detach (``MNT_DETACH``) takes the mount out of
the namespace even while calls are stuck in it. :func:`release_hung_mount` tries the three
in that order, each on a thread with a deadline (:mod:`kubevol.mount.probe`): resolving the
mount point itself may block on some filesystems.

Only the caller knows whether the mount is its own to remove: the node layer calls this for
the volume paths of a pod it tears down, never for a path it does not own. Nothing below the
mount is read or deleted here; the data stays on the server (a forced FUSE unmount ends the
daemon's connection, as ``umount -f`` does).
"""

from __future__ import annotations

import enum
import functools

from kubevol.errors import MountError
from kubevol.mount import syscalls
from kubevol.mount.probe import PathProbe, UnresponsiveError


class Released(enum.StrEnum):
    """How a hung mount left the mount table."""

    UNMOUNTED = "unmounted"
    FORCED = "unmounted with force (MNT_FORCE)"
    DETACHED = "detached lazily (MNT_DETACH)"
    #: It was gone already (someone else unmounted it).
    GONE = "already unmounted"


#: The attempts in mount-utils' order: umount2 flags, the umount(8) words for them, and
#: what a success achieves.
_ATTEMPTS = (
    (0, "umount", Released.UNMOUNTED),
    (syscalls.MNT_FORCE, "umount -f", Released.FORCED),
    (syscalls.MNT_DETACH, "umount -l", Released.DETACHED),
)


def release_hung_mount(probe: PathProbe, mount_point: str, *, path: str = "") -> Released:
    """Take the unresponsive mount at ``mount_point`` out of the mount table: unmount,
    then unmount with force, then detach lazily, each within the probe's deadline. Returns
    how it went; raises :class:`~kubevol.errors.MountError` naming every attempt when the
    mount stays (a forced attempt may still have aborted its pending calls, as ``umount -f``
    does). ``path`` is how the caller names the mount point in messages (default: the mount
    point)."""
    name = path or mount_point
    failures: list[str] = []
    for flags, words, outcome in _ATTEMPTS:
        try:
            unmounted = probe.call(
                mount_point, name, words, functools.partial(syscalls.umount, mount_point, flags),
                lane="unmount",
            )
        except UnresponsiveError as exc:
            failures.append(str(exc))
            continue
        except OSError as exc:
            failures.append(f"{words}: {exc.strerror}")
            continue
        # EINVAL: not a mount point (any more), whoever unmounted it.
        return outcome if unmounted else Released.GONE
    raise MountError(f"{name} did not answer and could not be unmounted ({'; '.join(failures)});"
                     " it was left mounted and nothing below it was deleted")
