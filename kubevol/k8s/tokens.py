"""Service-account tokens for projected volumes, as the kubelet's token manager gets them.

A projected ``serviceAccountToken`` source asks for a token of the pod's service account,
for an audience, valid ``expirationSeconds``, bound to the pod. A :class:`TokenProvider`
issues it: :class:`APITokenProvider` through the TokenRequest API of a real API server,
:class:`CommandTokenProvider` by running a command (the pluggable way, without an API
server). :class:`TokenManager` caches tokens per request and asks for a new one once 80%
of the token's lifetime has passed (or it is older than 24 hours), minus up to 10 seconds
of jitter, as the kubelet does; a long-running caller re-runs the volume's set-up
periodically, one-shot commands write the token once.

A token never appears in a ``repr``, a log line or an error message.
"""

from __future__ import annotations

import abc
import datetime
import json
import logging
import random
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from kubevol.errors import KubevolError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

#: ``expirationSeconds`` when a projection gives none (the API's default).
DEFAULT_EXPIRATION_SECONDS = 3600
#: A token older than this is refreshed whatever its lifetime (the kubelet's maxTTL).
MAX_TTL = datetime.timedelta(hours=24)
#: Up to this much earlier than due, chosen at random per check (spreads refreshes).
MAX_JITTER_SECONDS = 10.0
#: Part of the lifetime after which a token is refreshed.
REFRESH_FRACTION = 0.8

Clock = Callable[[], datetime.datetime]


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class TokenError(KubevolError):
    """A token could not be obtained."""


class TokenProviderMissingError(TokenError):
    """No token provider is configured."""


@attrs.frozen(kw_only=True)
class TokenRequest:
    """What a projected ``serviceAccountToken`` source asks for (a TokenRequest's spec)."""

    namespace: str
    service_account: str
    audiences: tuple[str, ...] = ()
    expiration_seconds: int = DEFAULT_EXPIRATION_SECONDS
    pod_name: str
    pod_uid: str

    def to_api(self) -> dict[str, object]:
        """The ``authentication.k8s.io/v1`` TokenRequest object for this request."""
        spec: dict[str, object] = {
            "audiences": list(self.audiences),
            "expirationSeconds": self.expiration_seconds,
            "boundObjectRef": {
                "apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.pod_uid,
            },
        }
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": self.service_account, "namespace": self.namespace},
            "spec": spec,
        }

    def describe(self) -> str:
        """``serviceaccount default/app for pod web``: for messages."""
        return f"serviceaccount {self.namespace}/{self.service_account} for pod {self.pod_name}"


@attrs.frozen(kw_only=True)
class IssuedToken:
    """A token and when it expires. ``expiration_seconds`` is the lifetime granted (the
    issuer may shorten the one asked for)."""

    token: str = attrs.field(repr=False)
    expiration: datetime.datetime
    expiration_seconds: int

    @property
    def issued_at(self) -> datetime.datetime:
        return self.expiration - datetime.timedelta(seconds=self.expiration_seconds)


class TokenProvider(abc.ABC):
    """Issues service-account tokens. Implementations are thread-safe."""

    @abc.abstractmethod
    def request_token(self, request: TokenRequest) -> IssuedToken:
        """A new token for ``request``; raises :class:`TokenError` (never showing a token)."""


def issued_from_api(obj: Mapping[str, object], request: TokenRequest, now: datetime.datetime,
                    who: str) -> IssuedToken:
    """An :class:`IssuedToken` from a TokenRequest answer (API dict). A missing expiration
    means ``now + expirationSeconds``. Raises TokenError naming ``who``."""
    status = obj.get("status") if isinstance(obj, Mapping) else None
    if not isinstance(status, Mapping) or not isinstance(status.get("token"), str) \
            or not status["token"]:
        raise TokenError(f"{who} returned no status.token for {request.describe()}")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        spec = {}
    seconds = spec.get("expirationSeconds") or request.expiration_seconds
    if not isinstance(seconds, int) or seconds <= 0:
        raise TokenError(f"{who} returned a bad spec.expirationSeconds for {request.describe()}")
    raw = status.get("expirationTimestamp")
    if raw is None:
        expiration = now + datetime.timedelta(seconds=seconds)
    elif isinstance(raw, datetime.datetime):
        expiration = raw if raw.tzinfo else raw.replace(tzinfo=datetime.UTC)
    else:
        try:
            expiration = datetime.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError as exc:
            raise TokenError(f"{who} returned a bad status.expirationTimestamp "
                             f"for {request.describe()}") from exc
        if expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=datetime.UTC)
    return IssuedToken(token=status["token"], expiration=expiration, expiration_seconds=seconds)


class APITokenProvider(TokenProvider):
    """Creates tokens with the TokenRequest API (``POST …/serviceaccounts/<sa>/token``)."""

    def __init__(self, api_client: ApiClient, clock: Clock = _utc_now) -> None:
        self._client = api_client
        self._clock = clock

    def request_token(self, request: TokenRequest) -> IssuedToken:
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            # The client serialises a dict body as it is: the API's own field names.
            answer = CoreV1Api(self._client).create_namespaced_service_account_token(
                request.service_account, request.namespace, request.to_api()
            )
        except ApiException as exc:
            # The body is not quoted: a Status carries no token, but say only what is needed.
            raise TokenError(f"TokenRequest for {request.describe()} failed: API status "
                             f"{exc.status} {exc.reason}") from None
        except (HTTPError, OSError) as exc:
            raise TokenError(f"TokenRequest for {request.describe()} failed: {exc}") from exc
        data = self._client.sanitize_for_serialization(answer)
        return issued_from_api(data, request, self._clock(), "the API server")


class CommandTokenProvider(TokenProvider):
    """Runs ``argv`` for each token: the TokenRequest object (JSON, as :meth:`TokenRequest.to_api`)
    on stdin, the answered TokenRequest (``status.token``, ``status.expirationTimestamp``)
    expected as JSON on stdout. A non-zero exit, a timeout or bad JSON is a TokenError."""

    def __init__(self, argv: Sequence[str], *, timeout: float = 30.0,
                 clock: Clock = _utc_now) -> None:
        if not argv:
            raise ValueError("the token provider command is empty")
        self.argv = tuple(argv)
        self.timeout = timeout
        self._clock = clock

    def request_token(self, request: TokenRequest) -> IssuedToken:
        who = f"token provider {self.argv[0]!r}"
        try:
            done = subprocess.run(
                self.argv, input=json.dumps(request.to_api()), capture_output=True, text=True,
                timeout=self.timeout, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TokenError(f"{who} could not run for {request.describe()}: {exc}") from exc
        if done.returncode != 0:
            # stderr is the operator's own diagnostics; a failed run has no token to leak.
            detail = done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else ""
            raise TokenError(f"{who} exited with status {done.returncode} for "
                             f"{request.describe()}" + (f": {detail}" if detail else ""))
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            raise TokenError(f"{who} did not print a JSON TokenRequest for "
                             f"{request.describe()}") from None
        return issued_from_api(answer, request, self._clock(), who)


class TokenManager:
    """Caches tokens per request and refreshes them as the kubelet's token manager does."""

    def __init__(self, provider: TokenProvider, *, clock: Clock = _utc_now,
                 jitter: Callable[[], float] | None = None) -> None:
        self.provider = provider
        self._clock = clock
        self._jitter = jitter or (lambda: random.random() * MAX_JITTER_SECONDS)
        self._cache: dict[TokenRequest, IssuedToken] = {}
        #: The requests cached for each pod (by UID).
        self._by_pod: dict[str, set[TokenRequest]] = {}
        #: When the tokens of pods with none cached need a refresh (:meth:`expect_refresh`).
        self._expected: dict[str, datetime.datetime] = {}
        #: Bumped whenever :meth:`refresh_times` may have changed.
        self.version = 0
        self._lock = threading.Lock()

    def get_token(self, request: TokenRequest) -> IssuedToken:
        """The cached token for ``request`` unless it needs a refresh, else a new one. When
        the refresh fails and the cached token has not expired yet, the cached one is used
        (and the failure logged), as the kubelet does."""
        with self._lock:
            cached = self._cache.get(request)
        now = self._clock()
        if cached is not None and not self.requires_refresh(cached, now):
            return cached
        try:
            issued = self.provider.request_token(request)
        except TokenError as exc:
            if cached is not None and now < cached.expiration:
                log.warning("token refresh for %s failed, using the cached token: %s",
                            request.describe(), exc)
                return cached
            raise
        with self._lock:
            self._cache[request] = issued
            self._by_pod.setdefault(request.pod_uid, set()).add(request)
            self._expected.pop(request.pod_uid, None)
            self.version += 1
        return issued

    def requires_refresh(self, issued: IssuedToken, now: datetime.datetime) -> bool:
        """True once 80% of the lifetime (or 24 hours) has passed, less a random jitter."""
        return self._past(self._refresh_time(issued), now)

    def _past(self, refresh_time: datetime.datetime, now: datetime.datetime) -> bool:
        """Whether ``now`` is past ``refresh_time``, less a random jitter."""
        return now > refresh_time - datetime.timedelta(seconds=self._jitter())

    @staticmethod
    def _refresh_time(issued: IssuedToken) -> datetime.datetime:
        """When 80% of the token's lifetime (or 24 hours) has passed."""
        # Integer seconds, as the kubelet computes 20% of the lifetime.
        remaining_fraction = datetime.timedelta(
            seconds=issued.expiration_seconds * round((1 - REFRESH_FRACTION) * 100) // 100
        )
        return min(issued.issued_at + MAX_TTL, issued.expiration - remaining_fraction)

    def refresh_times(self) -> dict[str, datetime.datetime]:
        """For each pod with tokens, when the first of them needs a refresh (without
        jitter): what a later run needs to know to :meth:`expect_refresh`."""
        with self._lock:
            out = dict(self._expected)
            for uid, requests in self._by_pod.items():
                out[uid] = min(self._refresh_time(self._cache[r]) for r in requests)
        return out

    def expect_refresh(self, times: Mapping[str, datetime.datetime]) -> None:
        """Take ``times`` (an earlier run's :meth:`refresh_times`) as when the tokens of
        those pods need a refresh, for :meth:`refresh_due` while none of theirs is
        cached: the tokens their volumes hold were issued before."""
        with self._lock:
            self._expected.update(
                (uid, when) for uid, when in times.items() if uid not in self._by_pod)
            self.version += 1

    def refresh_due(self, pod_uid: str) -> bool:
        """Whether a token bound to pod ``pod_uid`` needs a refresh now (:meth:`get_token`
        would ask for a new one), or none is known (after a restart, unless
        :meth:`expect_refresh` said when)."""
        with self._lock:
            issued = [self._cache[r] for r in self._by_pod.get(pod_uid, ())]
            expected = self._expected.get(pod_uid)
        now = self._clock()
        if not issued:
            return expected is None or self._past(expected, now)
        return any(self.requires_refresh(t, now) for t in issued)

    def forget_pod(self, pod_uid: str) -> None:
        """Drop the tokens bound to a pod (it was deleted)."""
        with self._lock:
            for request in self._by_pod.pop(pod_uid, ()):
                del self._cache[request]
            self._expected.pop(pod_uid, None)
            self.version += 1
