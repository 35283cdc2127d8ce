"""systemd's readiness protocol (``sd_notify``) for ``Type=notify`` services.

The protocol is one datagram of ``KEY=VALUE`` lines to the unix socket named by
``$NOTIFY_SOCKET`` (``@`` = Linux abstract namespace). It is written here rather than
taken from a package because it is a single ``sendto``, and the packages that wrap it are
either unmaintained or need libsystemd.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends state changes to systemd; does nothing when not started by systemd.

    ``watchdog_interval`` is how often to send ``WATCHDOG=1`` (half of ``$WATCHDOG_USEC``,
    as sd_watchdog_enabled(3) advises), or None when systemd does not watch the service.
    """

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address or None
        self.watchdog_interval = (
            watchdog_usec / 2e6 if watchdog_usec and self.address else None
        )

    @classmethod
    def from_environment(cls) -> SystemdNotifier:
        """From ``$NOTIFY_SOCKET`` and ``$WATCHDOG_USEC`` (ignored unless ``$WATCHDOG_PID``
        is unset or is this process)."""
        usec: int | None = None
        pid = os.environ.get("WATCHDOG_PID")
        if not pid or pid == str(os.getpid()):
            try:
                usec = int(os.environ.get("WATCHDOG_USEC", ""))
            except ValueError:
                usec = None
        return cls(os.environ.get("NOTIFY_SOCKET"), usec)

    def notify(self, state: str) -> bool:
        """Send ``state`` (e.g. ``READY=1``); returns whether it was sent. Never raises:
        a service must keep running when systemd cannot be told."""
        if self.address is None:
            return False
        address = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(state.encode(), address)
        except OSError as exc:
            log.warning("cannot notify systemd at %s: %s", self.address, exc)
            return False
        return True
