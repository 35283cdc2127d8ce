"""The kubelet's plugin watcher: registers plugins whose registration sockets appear in
``<root>/plugins_registry/`` and deregisters them when the sockets go.

For every new socket (sub-directories included, names starting with ``.`` ignored) the
watcher dials it, asks ``GetInfo``, picks the handler for the plugin's type (``CSIPlugin``),
validates, registers, and answers ``NotifyRegistrationStatus`` -- exactly the kubelet's
order. As in the kubelet, a plugin whose registration failed after validation stays known
until its socket goes (it is then deregistered), and a socket that is replaced (new inode
or modification time) is deregistered and registered again. Failures before that are
retried with backoff (0.5 s doubling up to 2 min 2 s).

The background thread watches the directory tree with inotify (the kubelet's fsnotify), so
a socket is registered as soon as it appears; it also re-scans every ``resync_interval``
seconds and when a failed registration is due for its retry, which catches anything
inotify cannot report (a watch limit reached, events lost in an overflow).

A socket can stay while nobody answers on it (its registrar was killed with ``SIGKILL``,
or hangs). As the kubelet's plugin connection monitor (``pluginwatcher/monitor.go``) does, a
second thread asks every registered plugin ``GetInfo`` on its registration socket every
``health_check_interval`` seconds (10 s); after ``max_ping_failures`` (2) failed pings in a
row the plugin is deregistered. Such a socket keeps being asked, and is registered again
as soon as it answers (a replaced socket registers at once, as any new socket does).
"""

from __future__ import annotations

import abc
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any

import attrs
import grpc
import inotify_simple

from kubevol.csi._pb import registration_pb2
from kubevol.plugins.csi.registration.registry import DriverRegistry
from kubevol.plugins.csi.registration.server import CSI_PLUGIN_TYPE, REGISTRATION_SERVICE
from kubevol.util.backoff import Backoff
from kubevol.util.lifecycle import RunsWhileEntered

log = logging.getLogger(__name__)

#: How long dialing a registration socket and GetInfo may take.
RPC_TIMEOUT = 10.0
INITIAL_RETRY = 0.5
MAX_RETRY = 122.0
#: How often the background thread re-scans even when inotify reported nothing.
RESYNC_INTERVAL = 30.0
#: How often registered plugins are asked GetInfo (the kubelet's connectionCheckInterval).
HEALTH_CHECK_INTERVAL = 10.0
#: Failed pings in a row after which a plugin is deregistered (the kubelet's maxFailures).
MAX_PING_FAILURES = 2
#: At most this many pings run at once.
_PING_WORKERS = 8
#: How often a waiting thread checks that it was not asked to stop.
_STOP_CHECK = 0.2
_WATCH_FLAGS = (
    inotify_simple.flags.CREATE | inotify_simple.flags.DELETE | inotify_simple.flags.MOVED_TO
    | inotify_simple.flags.MOVED_FROM | inotify_simple.flags.ATTRIB
    | inotify_simple.flags.DELETE_SELF
)
#: Registering a socket that failed is retried after these delays.
RETRY_BACKOFF = Backoff(initial=INITIAL_RETRY, maximum=MAX_RETRY)


class PluginHandler(abc.ABC):
    """What a plugin type does on registration (the kubelet's ``PluginHandler``)."""

    @abc.abstractmethod
    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """Raise when the plugin cannot be registered."""

    @abc.abstractmethod
    def register_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """Register it; raise on failure."""

    @abc.abstractmethod
    def deregister_plugin(self, name: str) -> None:
        """Forget it. Must not raise."""


class CSIPluginHandler(PluginHandler):
    """Registers CSI drivers in a :class:`DriverRegistry`."""

    def __init__(self, registry: DriverRegistry) -> None:
        self.registry = registry

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        try:
            self.registry.validate(name, endpoint, versions)
        except Exception as exc:
            raise ValueError(
                f"validation failed for CSI Driver {name} at endpoint {endpoint}: {exc}"
            ) from exc

    def register_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        self.registry.register_driver(name, endpoint, versions)

    def deregister_plugin(self, name: str) -> None:
        self.registry.deregister_driver(name)


@attrs.frozen(kw_only=True)
class _Socket:
    path: str
    inode: int
    mtime_ns: int


@attrs.frozen(kw_only=True)
class KnownPlugin:
    """A socket the watcher has dealt with: the plugin behind it and whether it registered."""

    socket_path: str
    plugin_type: str
    name: str
    endpoint: str
    registered: bool
    error: str = ""


def describe_error(exc: BaseException) -> str:
    """One line saying why a registration call failed: ``CODE: details`` for a gRPC status
    (never the multi-line repr of gRPC's error objects)."""
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        code = exc.code()
        text = f"{code.name if code is not None else 'UNKNOWN'}: {exc.details() or ''}"
    elif isinstance(exc, grpc.FutureTimeoutError):
        text = "the socket did not answer in time"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


class PluginWatcher(RunsWhileEntered):
    """Watches ``directory`` for registration sockets; see the module docstring.

    ``handlers`` maps plugin types to handlers (e.g. ``{"CSIPlugin": CSIPluginHandler(r)}``);
    :meth:`for_registry` builds the usual one. Call :meth:`sync` for one pass (and
    :meth:`check_health` for one round of pings), or :meth:`start` for the background
    threads (stop them with :meth:`stop` or ``with``).
    """

    def __init__(
        self,
        directory: str,
        handlers: Mapping[str, PluginHandler],
        *,
        resync_interval: float = RESYNC_INTERVAL,
        rpc_timeout: float = RPC_TIMEOUT,
        health_check_interval: float = HEALTH_CHECK_INTERVAL,
        max_ping_failures: int = MAX_PING_FAILURES,
    ) -> None:
        if max_ping_failures < 1:
            raise ValueError(f"max_ping_failures must be at least 1, not {max_ping_failures}")
        self.directory = os.path.abspath(directory)
        self.handlers = dict(handlers)
        self.resync_interval = resync_interval
        self.rpc_timeout = rpc_timeout
        self.health_check_interval = health_check_interval
        self.max_ping_failures = max_ping_failures
        self._known: dict[str, tuple[_Socket, KnownPlugin]] = {}
        # Per socket that failed to register: when to retry, and how many failures so far.
        self._retry: dict[_Socket, tuple[float, int]] = {}
        # Per registered plugin's socket: failed pings in a row.
        self._failures: dict[_Socket, int] = {}
        # Sockets whose plugins were deregistered for not answering, and those of them that
        # answered since (registered again by the next sync).
        self._dead: dict[str, tuple[_Socket, KnownPlugin]] = {}
        self._answered: set[_Socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def for_registry(cls, directory: str, registry: DriverRegistry, **kwargs: Any) -> PluginWatcher:
        """A watcher registering CSI drivers in ``registry``."""
        return cls(directory, {CSI_PLUGIN_TYPE: CSIPluginHandler(registry)}, **kwargs)

    # --- state ------------------------------------------------------------------------

    def known(self) -> list[KnownPlugin]:
        """Every socket dealt with, registered or not (deregistered for not answering
        included, with why), by path."""
        with self._lock:
            every = {**self._dead, **self._known}
        return [every[p][1] for p in sorted(every)]

    # --- one pass ---------------------------------------------------------------------

    def sync(self) -> None:
        """Deregister plugins whose sockets went or changed or that failed
        ``max_ping_failures`` pings in a row, then register new sockets and those that
        answer again."""
        present = {s.path: s for s in self._scan()}
        with self._lock:
            known = dict(self._known)
            failures = dict(self._failures)
        for path, (sock, plugin) in known.items():
            if present.get(path) != sock:
                self._deregister(path, plugin, f"socket {path} went away")
            elif plugin.registered and failures.get(sock, 0) >= self.max_ping_failures:
                why = f"no answer to {failures[sock]} GetInfo pings in a row"
                with self._lock:
                    self._dead[path] = (sock, attrs.evolve(plugin, registered=False, error=why))
                self._deregister(path, plugin, why)
        now = time.monotonic()
        with self._lock:
            for path, (sock, plugin) in list(self._dead.items()):
                if present.get(path) != sock or sock in self._answered:
                    del self._dead[path]
                    log.info("plugin %s (%s) at socket %s %s", plugin.name, plugin.plugin_type,
                             path, "answers again: registering it" if present.get(path) == sock
                             else "went away")
            self._answered.clear()
            self._failures = {
                s: n for s, n in self._failures.items() if self._known.get(s.path, (None,))[0] == s
            }
            self._retry = {s: r for s, r in self._retry.items() if present.get(s.path) == s}
            pending = [
                s for p, s in present.items() if p not in self._known and p not in self._dead
            ]
        for sock in pending:
            with self._lock:
                when, _ = self._retry.get(sock, (0.0, 0))
            if when <= now:
                self._register(sock)

    def _scan(self) -> list[_Socket]:
        found: list[_Socket] = []
        # Walked lazily so that pruning hidden directories (e.g. a server's private
        # directory where its socket is bound before being linked into place) takes effect;
        # os.walk skips directories it cannot read.
        for dirpath, dirnames, filenames in os.walk(self.directory):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    found.append(_Socket(path=path, inode=st.st_ino, mtime_ns=st.st_mtime_ns))
        return found

    def _deregister(self, path: str, plugin: KnownPlugin, why: str) -> None:
        handler = self.handlers.get(plugin.plugin_type)
        if handler is not None:
            try:
                handler.deregister_plugin(plugin.name)
            except Exception as exc:  # a handler bug must not stop the watcher
                log.error("DeRegisterPlugin %s failed: %s", plugin.name, describe_error(exc))
        log.info("plugin %s (%s) deregistered: %s", plugin.name, plugin.plugin_type, why)
        with self._lock:
            self._known.pop(path, None)

    def _register(self, sock: _Socket) -> None:
        try:
            self._register_once(sock)
        except Exception as exc:
            with self._lock:
                _, failures = self._retry.get(sock, (0.0, 0))
                delay = RETRY_BACKOFF.delay(failures)
                self._retry[sock] = (time.monotonic() + delay, failures + 1)
            log.error("RegisterPlugin error at socket %s (retrying in %.1fs): %s",
                      sock.path, delay, describe_error(exc))
        else:
            with self._lock:
                self._retry.pop(sock, None)

    def _register_once(self, sock: _Socket) -> None:
        channel = grpc.insecure_channel(f"unix://{sock.path}")
        try:
            grpc.channel_ready_future(channel).result(timeout=self.rpc_timeout)
            self._handle(channel, sock, self._get_info(channel))
        finally:
            channel.close()

    def _get_info(self, channel: grpc.Channel) -> registration_pb2.PluginInfo:
        get_info = channel.unary_unary(
            f"/{REGISTRATION_SERVICE}/GetInfo",
            request_serializer=registration_pb2.InfoRequest.SerializeToString,
            response_deserializer=registration_pb2.PluginInfo.FromString,
        )
        info: registration_pb2.PluginInfo = get_info(
            registration_pb2.InfoRequest(), timeout=self.rpc_timeout
        )
        return info

    def _handle(
        self, channel: grpc.Channel, sock: _Socket, info: registration_pb2.PluginInfo
    ) -> None:
        notify = channel.unary_unary(
            f"/{REGISTRATION_SERVICE}/NotifyRegistrationStatus",
            request_serializer=registration_pb2.RegistrationStatus.SerializeToString,
            response_deserializer=registration_pb2.RegistrationStatusResponse.FromString,
        )

        def tell(registered: bool, error: str = "") -> None:
            notify(
                registration_pb2.RegistrationStatus(plugin_registered=registered, error=error),
                timeout=self.rpc_timeout,
            )

        handler = self.handlers.get(info.type)
        if handler is None:
            message = (
                f"RegisterPlugin error -- no handler registered for plugin type: {info.type} "
                f"at socket {sock.path}"
            )
            tell(False, message)
            raise ValueError(message)
        endpoint = info.endpoint or sock.path
        versions = list(info.supported_versions)
        try:
            handler.validate_plugin(info.name, endpoint, versions)
        except Exception as exc:
            tell(False, f"RegisterPlugin error -- plugin validation failed with err: {exc}")
            raise
        # Known before registering, so that a socket removed meanwhile is deregistered.
        known = KnownPlugin(socket_path=sock.path, plugin_type=info.type, name=info.name,
                            endpoint=endpoint, registered=False)
        with self._lock:
            self._known[sock.path] = (sock, known)
        try:
            handler.register_plugin(info.name, endpoint, versions)
        except Exception as exc:
            error = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
            with self._lock:
                self._known[sock.path] = (sock, attrs.evolve(known, error=error))
            log.error("%s", error)
            tell(False, error)  # as in the kubelet: not retried until the socket changes
            return
        with self._lock:
            self._known[sock.path] = (sock, attrs.evolve(known, registered=True))
        log.info("plugin %s (%s) registered from %s", info.name, info.type, sock.path)
        tell(True)

    # --- health -----------------------------------------------------------------------

    def check_health(self) -> bool:
        """Ask every registered plugin, and every socket deregistered for not answering,
        ``GetInfo`` once (concurrently, each within ``rpc_timeout``) and record the answers
        for the next :meth:`sync`. Returns whether that sync has something to do."""
        with self._lock:
            registered = [sock for sock, plugin in self._known.values() if plugin.registered]
            dead = {sock for sock, _ in self._dead.values()}
        targets = registered + sorted(dead, key=lambda s: s.path)
        if not targets:
            return False
        with futures.ThreadPoolExecutor(min(len(targets), _PING_WORKERS),
                                        thread_name_prefix="plugin-ping") as pool:
            errors = list(pool.map(self._ping, targets))
        due = False
        with self._lock:
            for sock, error in zip(targets, errors, strict=True):
                if sock in dead:
                    if error is None and self._dead.get(sock.path, (None,))[0] == sock:
                        self._answered.add(sock)
                        due = True
                    continue
                known = self._known.get(sock.path)
                if known is None or known[0] != sock:
                    continue  # deregistered or replaced meanwhile
                if error is None:
                    self._failures.pop(sock, None)
                    continue
                failures = self._failures[sock] = self._failures.get(sock, 0) + 1
                due = due or failures >= self.max_ping_failures
                log.warning("plugin %s at socket %s failed GetInfo (%d of %d in a row): %s",
                            known[1].name, sock.path, failures, self.max_ping_failures, error)
        return due

    def _ping(self, sock: _Socket) -> str | None:
        """None when the socket answers GetInfo, else why not (one line)."""
        channel = grpc.insecure_channel(f"unix://{sock.path}")
        try:
            self._get_info(channel)
        except Exception as exc:
            return describe_error(exc)
        finally:
            channel.close()
        return None

    # --- background threads -----------------------------------------------------------

    def start(self) -> PluginWatcher:
        """Create the directory (0750), watch it in a daemon thread and ping registered
        plugins in another."""
        if self._threads:
            return self
        os.makedirs(self.directory, mode=0o750, exist_ok=True)
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._run, name="plugin-watcher", daemon=True),
            threading.Thread(target=self._run_health, name="plugin-health", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def _run_health(self) -> None:
        while not self._stop.wait(self.health_check_interval):
            try:
                if self.check_health():
                    self._wake.set()
            except Exception:
                log.exception("plugin health check failed")

    def _run(self) -> None:
        with inotify_simple.INotify() as inotify:
            watched: set[str] = set()
            while not self._stop.is_set():
                self._watch_tree(inotify, watched)
                self._wake.clear()
                try:
                    self.sync()
                except Exception:
                    log.exception("plugin watcher pass failed")
                self._wait(inotify, self._next_pass_in())

    def _watch_tree(self, inotify: inotify_simple.INotify, watched: set[str]) -> None:
        """Watch the directory and every sub-directory not watched yet (sub-directories
        appear over time; a removed one drops its watch by itself)."""
        for dirpath, dirnames, _ in os.walk(self.directory):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            if dirpath in watched and os.path.isdir(dirpath):
                continue
            try:
                inotify.add_watch(dirpath, _WATCH_FLAGS)
                watched.add(dirpath)
            except OSError as exc:  # gone meanwhile, or out of watches: the resync covers it
                log.debug("cannot watch %s: %s", dirpath, exc)
        watched.intersection_update(d for d in watched if os.path.isdir(d))

    def _next_pass_in(self) -> float:
        """Seconds until a failed registration is due again, at most the resync interval."""
        now = time.monotonic()
        with self._lock:
            due = [when - now for when, _ in self._retry.values()]
        return max(0.0, min([self.resync_interval, *due]))

    def _wait(self, inotify: inotify_simple.INotify, timeout: float) -> None:
        """Until an event, ``timeout`` seconds, a health check asking for a pass, or
        :meth:`stop`."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set() and not self._wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([inotify], [], [], min(left, _STOP_CHECK))
            if ready:
                inotify.read(timeout=0)
                return

    def stop(self) -> None:
        """Stop watching and pinging (registered plugins stay registered). Idempotent."""
        self._stop.set()
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()
