"""Serving gRPC on a unix socket: the one place that creates, publishes and removes one.

Both the driver framework and the registration socket use :func:`serve_on_unix_socket`. A
socket appears at its path only when it is ready:

1. A file already at the path is probed: a socket nobody answers on was left by a dead
   process and is removed; a live socket, or anything that is not a socket, is refused.
2. The server binds in a private directory (mode 0700, next to the path, so on the same
   filesystem), where nobody else can reach the socket. Its mode and owner are set there,
   so no client ever sees it with other permissions, and the server starts serving.
3. The socket is hard-linked to its path, which fails rather than replace a socket another
   process created in the meantime, and the private directory goes away.

So a client that finds the path can connect at once (no window between bind, listen,
chmod and serve), and a server that stops removes the path only while it is still its own
socket (same inode): a driver restarted on the same path is never unplugged by the old
process's shutdown. gRPC core itself unlinks the path it bound when it shuts down, which is
why it binds the private name and never the published one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import socket
import stat
import tempfile
from typing import TYPE_CHECKING

import attrs

from kubevol.csi.errors import CSIServeError

if TYPE_CHECKING:
    import grpc

_log = logging.getLogger("kubevol.csidriver.server")

#: The kernel's limit on a unix socket path (``sun_path`` minus its NUL).
MAX_SOCKET_PATH = 107

#: How long the stale-socket probe waits for an answer.
PROBE_TIMEOUT = 1.0


def remove_stale_socket(path: str) -> None:
    """Remove the socket file at ``path`` if nobody answers on it (left by a dead process).

    Raises :class:`CSIServeError` when a process listens there, when the file is not a
    socket, or when the probe cannot tell. Nothing at ``path`` is fine.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise CSIServeError(f"cannot serve on {path!r}: it exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        _log.info("removing stale socket %s left by an earlier process", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError as exc:
        raise CSIServeError(f"cannot tell whether socket {path!r} is in use: {exc}") from exc
    finally:
        probe.close()
    raise CSIServeError(f"cannot serve on {path!r}: another process is listening on it")


@attrs.define
class UnixSocket:
    """A socket published at ``path`` by :func:`serve_on_unix_socket`."""

    path: str
    device: int
    inode: int
    #: Keeps the private directory's name valid while gRPC may still refer to it.
    _dir_fd: int = -1

    def is_ours(self) -> bool:
        """Whether ``path`` is still the socket this server published."""
        try:
            info = os.lstat(self.path)
        except OSError:
            return False
        return stat.S_ISSOCK(info.st_mode) and (info.st_dev, info.st_ino) == (
            self.device,
            self.inode,
        )

    def remove(self) -> None:
        """Remove the published path if it is still this server's socket; call after the
        server stopped. Idempotent; a socket another process put there stays."""
        if self.is_ours():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1


def _private_address(private_dir: str, dir_fd: int) -> str:
    """The address to bind in ``private_dir``: through ``/proc/self/fd`` when it works
    (always short), else the directory's own path."""
    via_proc = f"/proc/self/fd/{dir_fd}/s"
    if os.path.isdir(os.path.dirname(via_proc)):
        return via_proc
    return os.path.join(private_dir, "s")


def serve_on_unix_socket(
    server: grpc.Server, path: str, *, mode: int, uid: int = -1, gid: int = -1
) -> UnixSocket:
    """Bind ``server`` (a ``grpc.Server`` not started yet) to ``path``, start it and publish
    the socket there with ``mode`` and owner ``uid``/``gid`` (-1: unchanged); see the module
    docstring for the order. On failure the server is stopped, nothing is left behind and
    :class:`CSIServeError` is raised."""
    path = os.path.abspath(path)
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise CSIServeError(
            f"cannot serve on {path!r}: unix socket paths are limited to "
            f"{MAX_SOCKET_PATH} bytes, this one has {len(path.encode())}"
        )
    remove_stale_socket(path)
    parent = os.path.dirname(path)
    try:
        private = tempfile.mkdtemp(prefix=".kubevol-sock-", dir=parent)
    except OSError as exc:
        raise CSIServeError(f"cannot create a socket in {parent!r}: {exc.strerror}") from exc
    dir_fd = os.open(private, os.O_PATH | os.O_DIRECTORY)
    try:
        address = _private_address(private, dir_fd)
        try:
            port = server.add_insecure_port(f"unix:{address}")
        except RuntimeError as exc:
            raise CSIServeError(f"cannot listen on {path!r}: {exc}") from exc
        if not port:
            raise CSIServeError(f"cannot listen on {path!r}")
        bound = os.path.join(private, "s")
        try:
            os.chmod(bound, mode)
            if uid != -1 or gid != -1:
                os.chown(bound, uid, gid)
            info = os.lstat(bound)
        except OSError as exc:
            raise CSIServeError(
                f"cannot set owner or mode of socket {path!r}: {exc.strerror}"
            ) from exc
        server.start()
        try:
            os.link(bound, path)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise CSIServeError(
                    f"cannot serve on {path!r}: another process created a socket there"
                ) from exc
            raise CSIServeError(f"cannot create socket {path!r}: {exc.strerror}") from exc
        return UnixSocket(path=path, device=info.st_dev, inode=info.st_ino, dir_fd=dir_fd)
    except BaseException:
        server.stop(None)
        os.close(dir_fd)
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
