"""A real GlusterFS server and real ``fuse.glusterfs`` mounts for tests, with the faults a
network filesystem has: a client or a brick that stops answering, a brick that dies.

Usage from a pytest fixture, as root, inside a private mount namespace
(``unshare -m --propagation private``)::

    @pytest.fixture
    def glusterfs(tmp_path):
        server = GlusterServer(tmp_path / "glusterfs").start()
        try:
            server.mount(tmp_path / "glusterfs" / "mnt")
            yield server
        finally:
            server.cleanup()

What :meth:`GlusterServer.start` builds, all below ``base_dir``:

- its own **glusterd**, from a volfile the server writes (``option working-directory``,
  ``run-directory`` and ``glusterd-sockfile`` point into ``base_dir``), started with ``-N``
  in a mount namespace of its own where ``/var/lib/glusterd``, ``/var/log/glusterfs`` and
  ``/var/run/gluster`` are bind mounts of directories below ``base_dir``: glusterd and its
  bricks write to paths they hard-code there (brick logs, brick sockets, ``cmd_history.log``),
  and nothing of a host's GlusterFS is read or written. The ``gluster`` CLI runs in that
  namespace too (it writes below ``/var/lib/glusterd``) and reaches glusterd through
  ``--glusterd-sock``. glusterd's geo-replication helper (``gsyncd``) is a stub there too:
  glusterd runs it twenty times at start-up, which takes 1.3 s of a 2 s start.
- **loopback only**: glusterd and the brick listen on one random address of 127.0.0.0/8
  outside 127.0.0.0/16 (the CLI refuses 127.0.0.1 and ``localhost`` for a brick). glusterd
  listens on port 24007, the default, because glusterd starts bricks without telling them its
  port: a brick fetches its volfile from ``HOST:24007``. Another glusterd on another address
  does not clash; one listening on *all* addresses on port 24007 does, and :meth:`start` says
  so. glusterd gives the brick a free port of 49152-60999 on the same address.
- a one-brick volume on a directory of a tmpfs (created with ``force``), with
  ``network.ping-timeout`` set to ``ping_timeout`` and the client's stat cache
  (``performance.stat-prefetch``) off, so that every call reaches the brick.

:meth:`GlusterServer.mount` runs the FUSE client (``glusterfs``) itself, or ``mount -t
glusterfs`` with ``helper=True``; both mount with the kernel's attribute and entry caches off,
so every stat below the mount reaches the client at once. What the faults do to a stat below
the mount (measured with ``ping_timeout=2`` on Debian 12's GlusterFS 10.3):

- :meth:`~GlusterServer.freeze` of the **client** (SIGSTOP): the stat hangs, with no timeout
  at all, until :meth:`~GlusterServer.thaw`; then it returns normally.
- :meth:`~GlusterServer.freeze` of the **brick** (SIGSTOP): the stat hangs until the client's
  ping timer gives up on the brick (about 2 x ``ping_timeout``, 4 s), then fails with ENOTCONN;
  further calls fail with ENOTCONN at once. After :meth:`~GlusterServer.thaw` the client
  reconnects within a few seconds and calls succeed again.
- :meth:`~GlusterServer.stop_server` (SIGKILL of the brick): calls fail with ENOTCONN at once.

Every process is stopped by PID, checked against its start time first (a dead brick stays a
zombie where nothing reaps orphans, and a PID can be reused). glusterd and the clients this
module starts itself get a parent-death signal (``setpriv --pdeathsig=KILL``; Linux ties it to
the starting *thread*). A test run killed outright leaves the daemonized brick (and
``helper=True`` clients) running; in a private mount namespace their mounts at least vanish
with the test process's namespace.

glusterd's mount namespace is a copy of the caller's taken at :meth:`GlusterServer.start`: the
mounts that existed then stay alive in it (a loop device stays busy, say) until the server is
cleaned up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from shlex import quote
from typing import NamedTuple, Self

from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.testing.mount_rig import mounts_under

GLUSTERD_PORT = 24007
"""The port glusterd listens on; its bricks fetch their volfile from it (they are not told
another)."""

BRICK_PORTS = (49152, 60999)
"""The range glusterd picks brick ports from (its ``base-port`` and ``max-port``)."""

REQUIRED_PROGRAMS = ("glusterd", "glusterfsd", "gluster", "glusterfs", "mount.glusterfs")
"""What Debian's glusterfs-server and glusterfs-client install and this module runs."""

HOST_DIRS = ("/var/lib/glusterd", "/var/log/glusterfs", "/var/run/gluster")
"""Paths glusterd and glusterfsd write to whatever their options say; glusterd sees a private
directory of the server's at each."""

_NO_KERNEL_CACHE = ("attribute-timeout=0", "entry-timeout=0", "negative-timeout=0")


class GlusterError(RuntimeError):
    """A GlusterFS command or process failed; the message has its output or its log's tail."""


def missing_programs() -> list[str]:
    """The programs of :data:`REQUIRED_PROGRAMS` that are not installed (on ``PATH`` or in
    ``/sbin``, ``/usr/sbin``)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in REQUIRED_PROGRAMS if shutil.which(name, path=path) is None]


class _Process(NamedTuple):
    """A process known by PID and start time (``/proc/PID/stat`` field 22), so that a PID
    reused by another process is never signalled."""

    pid: int
    start_time: str

    @classmethod
    def of(cls, pid: int) -> _Process | None:
        """The running process ``pid`` now, or None if there is none."""
        fields = _stat_fields(pid)
        if fields is None or fields[0] in "ZX":
            return None
        return cls(pid, fields[19])

    def alive(self) -> bool:
        """Whether this very process still runs (stopped counts; a zombie does not)."""
        fields = _stat_fields(self.pid)
        return fields is not None and fields[19] == self.start_time and fields[0] not in "ZX"

    def signal(self, signum: int) -> bool:
        """Send ``signum`` if the process still runs; whether it was sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def wait_stopped(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every thread of the process is stopped (state
        ``T`` in ``/proc/PID/task/*/stat``), or the process is gone; whether it got there.

        ``kill(SIGSTOP)`` returns before the threads stop: a thread blocked reading
        ``/dev/fuse`` is only woken, and may still take a request that arrives before it runs
        (seen in half of the tries right after the signal here)."""
        deadline = time.monotonic() + timeout
        while self.alive():
            states = [_stat_fields(self.pid, int(task)) for task in _tasks(self.pid)]
            if all(fields is None or fields[0] in "tT" for fields in states):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def wait_dead(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to end; whether it did."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def kill(self, timeout: float = 10.0) -> bool:
        """SIGKILL and wait for the end; whether it ended."""
        self.signal(signal.SIGKILL)
        return self.wait_dead(timeout)


def _stat_fields(pid: int, tid: int | None = None) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` (of thread ``tid``: ``/proc/PID/task/TID/stat``)
    after the command name (state first), or None."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(b")") + 2 :].decode().split()


def _tasks(pid: int) -> list[str]:
    """The thread IDs of process ``pid`` (none once it is gone)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [arg.decode(errors="replace") for arg in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _listen_address() -> str:
    """A random loopback address on which nothing listens on :data:`GLUSTERD_PORT`."""
    rng = random.SystemRandom()
    for _ in range(8):
        address = f"127.{rng.randint(100, 254)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, GLUSTERD_PORT))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            return address
    raise GlusterError(
        f"port {GLUSTERD_PORT} is taken on every loopback address tried: is a glusterd "
        f"listening on all addresses? glusterd's bricks can reach it on port {GLUSTERD_PORT} only"
    )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path.name})"
    return "\n".join(text.splitlines()[-lines:])


class GlusterServer:
    """A private glusterd serving one single-brick volume on loopback, the FUSE mounts of it
    made through :meth:`mount`, and the faults of :meth:`freeze` and :meth:`stop_server`.

    Needs root and the programs of :data:`REQUIRED_PROGRAMS`. Everything lives below
    ``base_dir`` (created if missing, removed by :meth:`cleanup`); keep it short, since
    glusterd's unix socket path must fit in 107 bytes. ``volume`` names the volume;
    ``ping_timeout`` is its ``network.ping-timeout`` in seconds (GlusterFS's default is 42),
    which bounds how long a frozen brick hangs a call; ``start_timeout`` bounds each wait of
    :meth:`start` and :meth:`mount`. ``with GlusterServer(...) as server:`` starts and cleans
    up.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        volume: str = "kubevol",
        ping_timeout: int = 2,
        start_timeout: float = 60.0,
    ) -> None:
        self.base_dir = Path(base_dir).absolute()
        self.volume = volume
        self.ping_timeout = ping_timeout
        self.start_timeout = start_timeout
        self.address = ""
        """The loopback address glusterd and the brick listen on, chosen by :meth:`start`."""
        self.brick = self.base_dir / "bricks" / volume
        """The brick directory: what the volume holds, seen without GlusterFS."""
        self.startup_seconds = 0.0
        """How long :meth:`start` took (glusterd up, volume created and started)."""
        self.cleanup_seconds = 0.0
        """How long the last :meth:`cleanup` took."""
        self._glusterd: subprocess.Popen[bytes] | None = None
        self._bricks: list[_Process] = []
        self._clients: dict[Path, _Process] = {}
        self._children: list[subprocess.Popen[bytes]] = []
        self._frozen: set[_Process] = set()
        self._made_base = False
        self._mounts_made = 0
        self._tmpfs_mounted = False
        self._made: list[Path] = []  # below base_dir, removed by cleanup()
        self._made_points: list[Path] = []  # mount points mount() created, rmdir'ed

    # -- paths ------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path:
        """glusterd's unix socket for the ``gluster`` CLI (``--glusterd-sock``)."""
        return self.base_dir / "run" / "glusterd.socket"

    @property
    def log_dir(self) -> Path:
        """Logs of glusterd, the CLI and the clients; the brick's is in ``ns/log/bricks``."""
        return self.base_dir / "log"

    @property
    def source(self) -> str:
        """``ADDRESS:/VOLUME``, what ``mount -t glusterfs`` takes."""
        return f"{self.address}:/{self.volume}"

    @property
    def glusterd_pid(self) -> int | None:
        """glusterd's process id while it runs."""
        proc = self._glusterd
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def mount_points(self) -> list[Path]:
        """The mounts made by :meth:`mount` and not yet undone, first first."""
        return list(self._clients)

    @property
    def mount_point(self) -> Path:
        """The first mount made by :meth:`mount`."""
        if not self._clients:
            raise GlusterError("nothing is mounted: call mount() first")
        return next(iter(self._clients))

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Start glusterd, create and start the volume; return self. Raises
        :class:`GlusterError` (with the output or log) if any step fails, after undoing what
        was done. Takes under a second."""
        if self._glusterd is not None:
            raise GlusterError("this server is already started")
        missing = missing_programs()
        if missing:
            raise GlusterError(
                f"GlusterFS is not installed (no {', '.join(missing)}): "
                "run scripts/install-system-deps.sh as root"
            )
        if len(os.fsencode(self.socket_path)) > 107:
            raise GlusterError(f"{self.socket_path} is too long for a unix socket")
        if any(c.isspace() for c in str(self.base_dir)):
            raise GlusterError(f"{self.base_dir!r} has white space, which a volfile cannot hold")
        started = time.monotonic()
        try:
            self._start_glusterd()
            self._create_volume()
        except BaseException:
            self.cleanup()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _start_glusterd(self) -> None:
        if not self.base_dir.exists():
            self.base_dir.mkdir(parents=True)
            self._made_base = True
        for sub in ("glusterd.vol", "work", "run", "log", "bricks", "ns"):
            if (self.base_dir / sub).exists():
                raise GlusterError(f"{self.base_dir / sub} exists: give a new base directory")
        for sub in ("work", "run", "log", "bricks", "ns"):
            (self.base_dir / sub).mkdir()
            self._made.append(self.base_dir / sub)
        for sub in ("lib", "log", "run"):
            (self.base_dir / "ns" / sub).mkdir()
        bricks = self.base_dir / "bricks"
        self._run(
            "mount", "-t", "tmpfs", "-o", "size=256m,mode=0700", "kubevol-gluster", str(bricks)
        )
        self._tmpfs_mounted = True
        self.brick.mkdir()
        self.address = _listen_address()
        volfile = self.base_dir / "glusterd.vol"
        self._made.append(volfile)
        volfile.write_text(
            "volume management\n"
            "    type mgmt/glusterd\n"
            f"    option working-directory {self.base_dir / 'work'}\n"
            f"    option run-directory {self.base_dir / 'run'}\n"
            f"    option glusterd-sockfile {self.socket_path}\n"
            "    option transport-type socket\n"
            f"    option transport.socket.bind-address {self.address}\n"
            f"    option transport.socket.listen-port {GLUSTERD_PORT}\n"
            "    option transport.socket.keepalive-time 10\n"
            "    option transport.socket.keepalive-interval 2\n"
            "    option transport.socket.read-fail-log off\n"
            "    option ping-timeout 0\n"
            "    option event-threads 1\n"
            f"    option base-port {BRICK_PORTS[0]}\n"
            f"    option max-port {BRICK_PORTS[1]}\n"
            "end-volume\n"
        )
        ns = self.base_dir / "ns"
        stub = ns / "gsyncd"
        stub.write_text('#!/bin/sh\necho "gsyncd.py (kubevol: geo-replication stub)"\n')
        stub.chmod(0o755)
        script = "\n".join(
            [
                *(
                    f"mount --bind {quote(str(ns / name))} {host}"
                    for name, host in zip(("lib", "log", "run"), HOST_DIRS, strict=True)
                ),
                # Geo-replication, never used here: glusterd runs its gsyncd (Python) twenty
                # times at start-up (1.3 s); a stub that only answers --version is instant.
                'gsyncd="$(glusterd --print-libexecdir)/gsyncd"',
                f'if [ -e "$gsyncd" ]; then mount --bind {quote(str(stub))} "$gsyncd"; fi',
                f"exec glusterd -N -L WARNING -f {quote(str(volfile))}"
                f" -l {quote(str(self.log_dir / 'glusterd.log'))}"
                f" -p {quote(str(self.base_dir / 'run' / 'glusterd.pid'))}",
            ]
        )
        with open(self.log_dir / "glusterd.out", "wb") as out:
            # setpriv and unshare exec: the PID is glusterd's. The shell's binds live in the
            # new mount namespace only, which glusterd's bricks inherit.
            self._glusterd = subprocess.Popen(
                ["setpriv", "--pdeathsig=KILL", "--", "unshare", "-m",
                 "--propagation", "private", "--", "sh", "-ec", script],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._glusterd.poll() is not None:
                raise GlusterError(
                    f"glusterd exited ({self._glusterd.returncode}) during start-up:\n"
                    f"{_tail(self.log_dir / 'glusterd.out')}\n{self.log_tail()}"
                )
            if self.socket_path.is_socket():
                result = self._cli("volume", "list", timeout=10, check=False)
                if result.returncode == 0:
                    return
            if time.monotonic() > deadline:
                raise GlusterError(
                    f"glusterd did not answer within {self.start_timeout} s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _create_volume(self) -> None:
        self.gluster("volume", "create", self.volume, f"{self.address}:{self.brick}", "force")
        self.gluster(
            "volume", "set", self.volume,
            "network.ping-timeout", str(self.ping_timeout),
            "performance.stat-prefetch", "off",
            "diagnostics.brick-log-level", "WARNING",
        )  # fmt: skip
        self.gluster("volume", "start", self.volume)
        self._bricks = self._find_bricks()

    def _find_bricks(self) -> list[_Process]:
        """The brick processes, from the pid files glusterd keeps in its run directory."""
        found = []
        for pidfile in sorted((self.base_dir / "run" / "vols" / self.volume).glob("*.pid")):
            with contextlib.suppress(ValueError, OSError):
                pid = int(pidfile.read_text().strip())
                proc = _Process.of(pid)
                args = _cmdline(pid)
                if proc is not None and str(self.brick) in args and "--brick-name" in args:
                    found.append(proc)
        if not found:
            raise GlusterError(f"no brick process runs for {self.volume}:\n{self.log_tail()}")
        return found

    def gluster(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``gluster ARGS`` against this server's glusterd (script mode) and return its
        output; raises :class:`GlusterError` with the output if it fails."""
        return self._cli(*args, timeout=timeout, check=True).stdout

    def _cli(self, *args: str, timeout: float, check: bool) -> subprocess.CompletedProcess[str]:
        # In glusterd's mount namespace: the CLI writes below /var/lib/glusterd too.
        pid = self.glusterd_pid
        if pid is None:
            raise GlusterError(f"gluster {' '.join(args)}: glusterd is not running")
        command = [
            "nsenter", f"--mount=/proc/{pid}/ns/mnt", "--",
            "gluster", "--mode=script", f"--glusterd-sock={self.socket_path}",
            f"--log-file={self.log_dir / 'cli.log'}", *args,
        ]  # fmt: skip
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise GlusterError(f"gluster {' '.join(args)}: no answer in {timeout} s") from exc
        if check and result.returncode != 0:
            raise GlusterError(
                f"gluster {' '.join(args)} failed ({result.returncode}): "
                f"{(result.stdout + result.stderr).strip()}"
            )
        return result

    # -- mounts -----------------------------------------------------------------------------

    def mount(self, target: str | os.PathLike[str], *, helper: bool = False) -> int:
        """Mount the volume at ``target`` (created if missing), wait until its root answers,
        and return the FUSE client's PID.

        By default the client (``glusterfs -N``) is this server's child; ``helper=True`` runs
        ``mount -t glusterfs`` instead (the client daemonizes, and is found by its command
        line), as a CSI driver would. Raises :class:`GlusterError` if the mount does not work
        within ``start_timeout``.
        """
        point = Path(target).absolute()
        if point in self._clients:
            raise GlusterError(f"{point} is already mounted by this server")
        if not point.exists():
            point.mkdir(parents=True)
            self._made_points.append(point)
        self._mounts_made += 1
        log = self.log_dir / f"client-{self._mounts_made}.log"
        child: subprocess.Popen[bytes] | None = None
        if helper:
            options = ",".join(["log-level=WARNING", f"log-file={log}", *_NO_KERNEL_CACHE])
            self._run("mount", "-t", "glusterfs", "-o", options, self.source, str(point),
                      timeout=self.start_timeout)  # fmt: skip
        else:
            command = [
                "setpriv", "--pdeathsig=KILL", "--", "glusterfs", "-N", "--process-name=fuse",
                "--log-level=WARNING", f"--log-file={log}", f"--volfile-server={self.address}",
                f"--volfile-id={self.volume}", *(f"--{option}" for option in _NO_KERNEL_CACHE),
                str(point),
            ]  # fmt: skip
            child = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self._children.append(child)
        try:
            self._wait_mounted(point, child, log)
            proc = _Process.of(child.pid) if child is not None else self._find_client(point)
            if proc is None:
                raise GlusterError(f"the client of {point} is gone:\n{_tail(log)}")
        except BaseException:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
            if child is not None:
                child.kill()
                child.wait()
            raise
        self._clients[point] = proc
        return proc.pid

    def _wait_mounted(self, point: Path, child: subprocess.Popen[bytes] | None, log: Path) -> None:
        """Wait until ``point`` is a fuse.glusterfs mount whose root answers a stat (run in
        a process with a timeout: a stat below the mount may hang)."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            if child is not None and child.poll() is not None:
                raise GlusterError(f"glusterfs exited ({child.returncode}):\n{_tail(log)}")
            if any(
                e.mount_point == str(point) and e.fs_type == "fuse.glusterfs"
                for e in parse_mountinfo()
            ):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    stat = subprocess.run(
                        ["stat", "-c", "%i", str(point)],
                        capture_output=True, text=True, timeout=5, check=False,
                    )  # fmt: skip
                    if stat.stdout.strip() == "1":  # the root of a GlusterFS volume
                        return
            if time.monotonic() > deadline:
                raise GlusterError(
                    f"{point} did not answer in {self.start_timeout} s:\n{_tail(log)}"
                )
            time.sleep(0.05)

    def _find_client(self, point: Path) -> _Process | None:
        """The daemonized ``glusterfs`` whose command line ends with ``point``."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            args = _cmdline(int(entry))
            if (
                len(args) > 1
                and os.path.basename(args[0]) == "glusterfs"
                and args[-1] == str(point)
                and f"--volfile-server={self.address}" in args
            ):
                return _Process.of(int(entry))
        return None

    def client_pid(self, mount_point: str | os.PathLike[str] | None = None) -> int:
        """The PID of the FUSE client of ``mount_point`` (default: the first mount)."""
        point = Path(mount_point).absolute() if mount_point is not None else self.mount_point
        return self._clients[point].pid

    def brick_pids(self) -> list[int]:
        """The PIDs of the volume's brick processes (``glusterfsd``) that still run."""
        return [proc.pid for proc in self._bricks if proc.alive()]

    # -- faults -----------------------------------------------------------------------------

    def freeze(self, *, clients: bool = True, bricks: bool = False) -> None:
        """SIGSTOP the FUSE clients of every mount and/or the brick processes, and return
        once all their threads have stopped.

        A frozen client makes every call below its mount hang, without a timeout, until
        :meth:`thaw`. A frozen brick makes a call hang until the client's ping timer gives up
        on the brick (about twice ``ping_timeout``), then fail with ENOTCONN; later calls
        fail at once until the brick is thawed and the client has reconnected.
        """
        targets = [*(self._clients.values() if clients else ()), *(self._bricks if bricks else ())]
        for proc in targets:
            if proc.signal(signal.SIGSTOP):
                self._frozen.add(proc)
        for proc in targets:
            if not proc.wait_stopped(self.start_timeout):
                raise GlusterError(f"process {proc.pid} did not stop after SIGSTOP")

    def thaw(self) -> None:
        """SIGCONT everything :meth:`freeze` stopped. Idempotent."""
        for proc in self._frozen:
            proc.signal(signal.SIGCONT)
        self._frozen.clear()

    def stop_server(self) -> None:
        """Kill the brick processes (SIGKILL) and wait for their end: every call below a
        mount then fails with ENOTCONN. glusterd keeps running."""
        for proc in self._bricks:
            if not proc.kill():
                raise GlusterError(f"brick process {proc.pid} did not die")

    # -- cleanup ----------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Undo everything: thaw, lazily unmount every mount made here (``umount -l``) and end
        its client, stop the volume by killing its bricks, stop glusterd (all by PID), unmount
        the bricks' tmpfs and remove what :meth:`start` and :meth:`mount` created (``base_dir``
        too if :meth:`start` made it). Idempotent; takes a few tens of milliseconds. Raises
        :class:`GlusterError` naming what could not be undone; nothing is deleted while
        something is still mounted below ``base_dir``."""
        started = time.monotonic()
        problems: list[str] = []
        self.thaw()
        for point, proc in reversed(self._clients.items()):
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
            if not proc.wait_dead(5) and not proc.kill():
                problems.append(f"the client of {point} (PID {proc.pid}) did not die")
        self._clients.clear()
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait()
        self._children.clear()
        # The volume stops with its bricks, killed: `gluster volume stop` would wait a second
        # for them to end gracefully, for nothing (their tmpfs is discarded).
        glusterd = self._glusterd
        for proc in self._bricks:
            if not proc.kill():
                problems.append(f"brick process {proc.pid} did not die")
        self._bricks.clear()
        if glusterd is not None:
            self._glusterd = None
            if glusterd.poll() is None:
                glusterd.terminate()
                try:
                    glusterd.wait(10)
                except subprocess.TimeoutExpired:
                    glusterd.kill()
                    glusterd.wait()
        bricks = str(self.base_dir / "bricks")
        while self._tmpfs_mounted and bricks in mounts_under(bricks):
            result = subprocess.run(
                ["umount", "-l", bricks], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                problems.append(f"umount -l {bricks}: {result.stderr.strip()}")
                break
        self._tmpfs_mounted = False
        left = mounts_under(self.base_dir)
        if left:
            problems.append(f"still mounted below {self.base_dir}: {left}; not removing it")
        else:
            self._remove_made()
        self.cleanup_seconds = time.monotonic() - started
        if problems:
            raise GlusterError("GlusterFS cleanup: " + "; ".join(problems))

    def _remove_made(self) -> None:
        """Remove what start() and mount() created; a mount point only if it is an empty
        directory again (rmdir)."""
        mounted = {e.mount_point for e in parse_mountinfo()}
        for point in reversed(self._made_points):
            if str(point) not in mounted:
                with contextlib.suppress(OSError):
                    point.rmdir()
        self._made_points.clear()
        for path in reversed(self._made):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self._made.clear()
        if self._made_base:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self._made_base = False

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of glusterd's log, for error messages."""
        return _tail(self.log_dir / "glusterd.log", lines)

    def _run(self, *args: str, timeout: float = 60.0) -> None:
        try:
            result = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise GlusterError(f"{' '.join(args)}: did not end in {timeout} s") from exc
        if result.returncode != 0:
            raise GlusterError(
                f"{' '.join(args)} failed ({result.returncode}): "
                f"{(result.stdout + result.stderr).strip()}"
            )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()
