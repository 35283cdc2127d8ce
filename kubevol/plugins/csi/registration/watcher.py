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


class PluginWatcher(RunsWhileEntered):
    """Watches ``directory`` for registration sockets; see the module docstring.

    ``handlers`` maps plugin types to handlers (e.g. ``{"CSIPlugin": CSIPluginHandler(r)}``);
    :meth:`for_registry` builds the usual one. Call :meth:`sync` for one pass, or
    :meth:`start` for a background thread (stop it with :meth:`stop` or ``with``).
    """

    def __init__(
        self,
        directory: str,
        handlers: Mapping[str, PluginHandler],
        *,
        resync_interval: float = RESYNC_INTERVAL,
        rpc_timeout: float = RPC_TIMEOUT,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.handlers = dict(handlers)
        self.resync_interval = resync_interval
        self.rpc_timeout = rpc_timeout
        self._known: dict[str, tuple[_Socket, KnownPlugin]] = {}
        # Per socket that failed to register: when to retry, and how many failures so far.
        self._retry: dict[_Socket, tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_registry(cls, directory: str, registry: DriverRegistry, **kwargs: Any) -> PluginWatcher:
        """A watcher registering CSI drivers in ``registry``."""
        return cls(directory, {CSI_PLUGIN_TYPE: CSIPluginHandler(registry)}, **kwargs)

    # --- state ------------------------------------------------------------------------

    def known(self) -> list[KnownPlugin]:
        """Every socket dealt with, registered or not, by path."""
        with self._lock:
            return [self._known[p][1] for p in sorted(self._known)]

    # --- one pass ---------------------------------------------------------------------

    def sync(self) -> None:
        """Deregister plugins whose sockets went or changed, then register new sockets."""
        present = {s.path: s for s in self._scan()}
        with self._lock:
            known = dict(self._known)
        for path, (sock, plugin) in known.items():
            if present.get(path) != sock:
                self._deregister(path, plugin)
        now = time.monotonic()
        with self._lock:
            self._retry = {s: r for s, r in self._retry.items() if present.get(s.path) == s}
            pending = [s for p, s in present.items() if p not in self._known]
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

    def _deregister(self, path: str, plugin: KnownPlugin) -> None:
        handler = self.handlers.get(plugin.plugin_type)
        if handler is not None:
            try:
                handler.deregister_plugin(plugin.name)
            except Exception as exc:  # a handler bug must not stop the watcher
                log.error("DeRegisterPlugin %s failed: %s", plugin.name, exc)
        log.info("plugin %s (%s) deregistered: socket %s went away",
                 plugin.name, plugin.plugin_type, path)
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
                      sock.path, delay, exc)
        else:
            with self._lock:
                self._retry.pop(sock, None)

    def _register_once(self, sock: _Socket) -> None:
        channel = grpc.insecure_channel(f"unix://{sock.path}")
        try:
            grpc.channel_ready_future(channel).result(timeout=self.rpc_timeout)
            get_info = channel.unary_unary(
                f"/{REGISTRATION_SERVICE}/GetInfo",
                request_serializer=registration_pb2.InfoRequest.SerializeToString,
                response_deserializer=registration_pb2.PluginInfo.FromString,
            )
            info = get_info(registration_pb2.InfoRequest(), timeout=self.rpc_timeout)
            self._handle(channel, sock, info)
        finally:
            channel.close()

    def _handle(self, channel: Any, sock: _Socket, info: Any) -> None:
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

    # --- background thread ------------------------------------------------------------

    def start(self) -> PluginWatcher:
        """Create the directory (0750) and watch it in a daemon thread."""
        if self._thread is not None:
            return self
        os.makedirs(self.directory, mode=0o750, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="plugin-watcher", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with inotify_simple.INotify() as inotify:
            watched: set[str] = set()
            while not self._stop.is_set():
                self._watch_tree(inotify, watched)
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
        """Until an event, ``timeout`` seconds, or :meth:`stop`."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([inotify], [], [], min(left, _STOP_CHECK))
            if ready:
                inotify.read(timeout=0)
                return

    def stop(self) -> None:
        """Stop watching (registered plugins stay registered). Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
