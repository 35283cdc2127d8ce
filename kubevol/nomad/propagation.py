"""Mount propagation for plugins run as tasks (what Nomad's ``csi_plugin_supervisor`` hook
asks of the task driver: the plugin's directory mounted into the task "bidirectional").

A node plugin in its own mount namespace (a container) stages and publishes volumes by
mounting under its view of the plugin directory. Those mounts reach the host, where the
agent and the other allocations' tasks find them, only when the host side of that directory
is a *shared* mount and the task's mount of it is shared too (OCI ``rshared``; Kubernetes'
``Bidirectional``). :func:`make_rshared` makes the host side so: it binds the directory on
itself when it is not a mount point yet (as the kubelet does with its root), then marks it
``rshared``. The task runtime then mounts it with the propagation of
:class:`MountPropagation` (``TaskMount.runtime_propagation``).
"""

from __future__ import annotations

import enum
import os

from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.mount.mountread import PROC_MOUNTINFO
from kubevol.mount.syscalls import MS_BIND, mount
from kubevol.nomad.errors import MountPropagationError

# Flags of mount(2) the mount layer has no use for (include/uapi/linux/mount.h).
MS_REC = 1 << 14
MS_SHARED = 1 << 20


class MountPropagation(enum.StrEnum):
    """How the plugin directory is mounted into the plugin's task (Nomad's
    ``propagation_mode`` values)."""

    #: Mounts go both ways (OCI ``rshared``): what a node plugin needs. The default.
    BIDIRECTIONAL = "bidirectional"
    #: Host mounts reach the task, not the reverse (OCI ``rslave``).
    HOST_TO_TASK = "host-to-task"
    #: No propagation (OCI ``rprivate``); the host side is left as it is.
    PRIVATE = "private"

    @property
    def runtime_name(self) -> str:
        """The OCI/Docker name of this propagation."""
        return {"bidirectional": "rshared", "host-to-task": "rslave", "private": "rprivate"}[
            self.value
        ]


def propagation_of(path: str, mountinfo: str = PROC_MOUNTINFO) -> str | None:
    """``shared``, ``slave``, ``shared+slave`` or ``private`` for the mount whose mount
    point is ``path`` (the topmost), None when ``path`` is not a mount point."""
    target = os.path.realpath(path)
    found = [m for m in parse_mountinfo(mountinfo) if m.mount_point == target]
    if not found:
        return None
    fields = found[-1].optional_fields
    kinds = []
    if any(f.startswith("shared:") for f in fields):
        kinds.append("shared")
    if any(f.startswith("master:") for f in fields):
        kinds.append("slave")
    return "+".join(kinds) or "private"


def make_rshared(path: str) -> bool:
    """Make ``path`` (an existing directory) a mount point with ``rshared`` propagation.
    Idempotent; returns True when it bound ``path`` on itself to make it a mount point.

    Raises :class:`~kubevol.nomad.errors.MountPropagationError` naming ``path`` when a
    mount call fails (not root, no ``CAP_SYS_ADMIN``); a bind made here is then left in
    place, harmless.
    """
    target = os.path.realpath(path)
    bound = False
    try:
        if propagation_of(target) is None:
            mount(target, target, "", MS_BIND | MS_REC)
            bound = True
        mount("none", target, "", MS_SHARED | MS_REC)
    except OSError as exc:
        raise MountPropagationError(
            exc.errno, f"cannot make {target!r} a shared mount for the plugin: {exc.strerror}"
        ) from exc
    return bound
