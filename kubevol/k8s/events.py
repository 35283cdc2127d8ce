"""Kubernetes Events about pods, correlated and rate-limited as client-go's recorder does
(``k8s.io/client-go/tools/record``: ``events_cache.go``), and posted in the background.

What :class:`EventRecorder` does with each event, in client-go's order:

1. **aggregate**: events about one object that differ only in their message (same source,
   object, type and reason) are counted per 10-minute window; from the tenth distinct
   message on, one event "(combined from similar events): <message>" stands for them;
2. **count**: an event seen before (same everything, message included) is not posted again
   but patched: its ``count`` goes up and its ``lastTimestamp`` moves;
3. **spam filter**: each source may say 25 things about one object at once, then one every
   5 minutes (a token bucket per object); what is over is dropped.

Posting happens on one background thread with a bounded queue (client-go's 1,000): an
operation that reports a failure never waits for the API server, and an API server that
does not answer costs the events, not the node. Failures to post are logged, not raised.
"""

from __future__ import annotations

import collections
import datetime
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import attrs

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger(__name__)

_K = TypeVar("_K")
_V = TypeVar("_V")

#: client-go's correlator settings (``events_cache.go``).
MAX_CACHE_ENTRIES = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL = 600.0
SPAM_BURST = 25
SPAM_QPS = 1.0 / 300.0
#: client-go's broadcaster queue length (``maxQueuedEvents``).
MAX_QUEUED = 1000

NORMAL = "Normal"
WARNING = "Warning"


@attrs.frozen(kw_only=True)
class ObjectRef:
    """The object an event is about (``involvedObject``)."""

    kind: str = "Pod"
    api_version: str = "v1"
    namespace: str
    name: str
    uid: str

    def to_api(self) -> dict[str, str]:
        return {"kind": self.kind, "apiVersion": self.api_version,
                "namespace": self.namespace, "name": self.name, "uid": self.uid}


class EventSink(Protocol):
    """Where events go: the API server's ``events`` of a namespace."""

    def create(self, namespace: str, event: dict[str, object]) -> None: ...

    def patch(self, namespace: str, name: str, patch: dict[str, object]) -> None: ...


class KubeEventSink:
    """An :class:`EventSink` on a ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: object) -> None:
        self.api_client = api_client

    def _core(self) -> CoreV1Api:  # the client's API class, imported late (a slow import)
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client)

    def create(self, namespace: str, event: dict[str, object]) -> None:
        self._core().create_namespaced_event(namespace, event, _preload_content=False,
                                             _request_timeout=10)

    def patch(self, namespace: str, name: str, patch: dict[str, object]) -> None:
        self._core().patch_namespaced_event(name, namespace, patch, _preload_content=False,
                                            _request_timeout=10)


def _timestamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define
class _Bucket:
    tokens: float
    at: float


@attrs.define
class _Seen:
    name: str
    count: int
    first: float


class EventRecorder:
    """Records events about objects on ``sink`` as the module describes; ``component`` and
    ``host`` are the event's source (the kubelet's: ``kubelet`` and the node's name).
    :meth:`close` sends what is queued (for at most ``timeout`` seconds) and stops."""

    def __init__(
        self, sink: EventSink, *, component: str, host: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.component = component
        self.host = host
        self.clock = clock
        self._lock = threading.Lock()
        self._similar: collections.OrderedDict[tuple[str, ...], tuple[set[str], float]] = (
            collections.OrderedDict())
        self._seen: collections.OrderedDict[tuple[str, ...], _Seen] = collections.OrderedDict()
        self._buckets: collections.OrderedDict[str, _Bucket] = collections.OrderedDict()
        #: (namespace, "create" or "patch", event name, body) to send; None: stop.
        self._queue: queue.Queue[tuple[str, str, str, dict[str, object]] | None] = (
            queue.Queue(MAX_QUEUED))
        self._thread = threading.Thread(target=self._send, name="kubevol-events", daemon=True)
        self._thread.start()
        #: Events dropped: over the spam budget, or the queue was full.
        self.dropped = 0

    def event(self, about: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Record one event (never blocks on the API server)."""
        now = self.clock()
        with self._lock:
            message, key = self._aggregate(about, type_, reason, message, now)
            seen = self._seen.get(key)
            if seen is None:
                seen = _Seen(name=f"{about.name}.{int(now * 1e9):x}", count=1, first=now)
            else:
                seen.count += 1
            _remember(self._seen, key, seen)
            if not self._take_token(about, now):
                self.dropped += 1
                return
        body: dict[str, object]
        if seen.count == 1:
            verb, body = "create", {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": seen.name, "namespace": about.namespace},
                "involvedObject": about.to_api(), "type": type_, "reason": reason,
                "message": message, "count": 1,
                "firstTimestamp": _timestamp(now), "lastTimestamp": _timestamp(now),
                "source": {"component": self.component, "host": self.host},
                "reportingComponent": self.component, "reportingInstance": self.host,
            }
        else:
            verb, body = "patch", {"count": seen.count, "message": message,
                                   "lastTimestamp": _timestamp(now)}
        try:
            self._queue.put_nowait((about.namespace, verb, seen.name, body))
        except queue.Full:
            self.dropped += 1

    def _aggregate(
        self, about: ObjectRef, type_: str, reason: str, message: str, now: float
    ) -> tuple[str, tuple[str, ...]]:
        """The message to record and the key that counts it (client-go's aggregator)."""
        similar = (about.namespace, about.name, about.uid, about.kind, type_, reason)
        messages, last = self._similar.get(similar, (set(), 0.0))
        if now - last > AGGREGATE_INTERVAL:
            messages = set()
        messages.add(message)
        if len(messages) >= AGGREGATE_MAX_EVENTS:
            messages.pop()
            _remember(self._similar, similar, (messages, now))
            return f"(combined from similar events): {message}", (*similar, "")
        _remember(self._similar, similar, (messages, now))
        return message, (*similar, message)

    def _take_token(self, about: ObjectRef, now: float) -> bool:
        """client-go's spam filter: a token bucket per source and object."""
        key = f"{about.kind}/{about.namespace}/{about.name}/{about.uid}"
        bucket = self._buckets.get(key) or _Bucket(tokens=SPAM_BURST, at=now)
        bucket.tokens = min(SPAM_BURST, bucket.tokens + (now - bucket.at) * SPAM_QPS)
        bucket.at = now
        _remember(self._buckets, key, bucket)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _send(self) -> None:
        while (item := self._queue.get()) is not None:
            namespace, verb, name, body = item
            try:
                if verb == "create":
                    self.sink.create(namespace, body)
                else:
                    self.sink.patch(namespace, name, body)
            except Exception as exc:  # an API server that fails costs the event only
                log.warning("event %s/%s not recorded: %s", namespace, name, exc)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (at most ``timeout`` seconds), then stop. Idempotent."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)


def _remember(cache: collections.OrderedDict[_K, _V], key: _K, value: _V) -> None:
    """Put ``key`` last in an LRU of at most :data:`MAX_CACHE_ENTRIES`."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > MAX_CACHE_ENTRIES:
        cache.popitem(last=False)
