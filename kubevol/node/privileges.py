"""Checking, before anything is touched, that the process may mount (and set up loop
devices), so that a command without them fails with one clear message instead of a mount(8)
error half-way through."""

from __future__ import annotations

import os

from kubevol.node.errors import PrivilegeError

#: Bit of CAP_SYS_ADMIN in the capability sets of ``/proc/self/status``.
CAP_SYS_ADMIN = 21

LOOP_CONTROL = "/dev/loop-control"


def effective_capabilities(status_path: str = "/proc/self/status") -> int:
    """The effective capability set (``CapEff``) as a bit mask; 0 when it cannot be read."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        return 0
    return 0


def in_user_namespace(uid_map_path: str = "/proc/self/uid_map") -> bool:
    """Whether the process runs in a user namespace other than the initial one."""
    try:
        with open(uid_map_path, encoding="ascii") as f:
            lines = f.read().split()
    except OSError:
        return False
    return lines != ["0", "0", "4294967295"]


def missing_privileges(
    *,
    loop_devices: bool = False,
    status_path: str = "/proc/self/status",
    uid_map_path: str = "/proc/self/uid_map",
    loop_control: str = LOOP_CONTROL,
) -> list[str]:
    """What this process lacks to mount filesystems (and, with ``loop_devices``, to set up
    loop devices), one sentence each; empty when nothing is missing."""
    missing = []
    if not effective_capabilities(status_path) >> CAP_SYS_ADMIN & 1:
        missing.append(
            f"CAP_SYS_ADMIN, needed to mount and unmount filesystems (this process runs as "
            f"uid {os.geteuid()} without it)"
        )
    if loop_devices:
        if in_user_namespace(uid_map_path):
            missing.append(
                "loop devices, which cannot be set up from inside a user namespace "
                "(the kernel allows them only to the initial namespace's root)"
            )
        elif not os.access(loop_control, os.R_OK | os.W_OK):
            missing.append(f"read-write access to {loop_control}, needed to set up loop devices")
    return missing


def require_privileges(command: str, *, loop_devices: bool = False, **paths: str) -> None:
    """Raise :class:`~kubevol.node.errors.PrivilegeError` saying what is missing and how to
    run ``command`` instead; return quietly when nothing is missing."""
    missing = missing_privileges(loop_devices=loop_devices, **paths)
    if not missing:
        return
    how = [f"run it as root, e.g. `sudo {command}`"]
    if not loop_devices:
        how.append(
            "or, where the kernel allows unprivileged user namespaces, inside a user and "
            f"mount namespace: `unshare --user --map-root-user --mount {command}` "
            "(tmpfs and bind mounts work there)"
        )
    raise PrivilegeError(
        "this process lacks " + "; and ".join(missing) + ". To fix it, " + " ".join(how) + "."
    )
