"""Covers kubevol.k8s.tokens.

Service-account tokens: the TokenRequest API (stand-in server), a command provider, and
the manager's refresh at 80% of the lifetime."""

from __future__ import annotations

import datetime
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.k8s.tokens import (
    APITokenProvider,
    CommandTokenProvider,
    IssuedToken,
    TokenError,
    TokenManager,
    TokenProvider,
    TokenRequest,
)
from kubevol.testing.kube_api import KubeAPIServer

REQUEST = TokenRequest(
    namespace="ns", service_account="app", audiences=("vault",), expiration_seconds=1000,
    pod_name="web", pod_uid="uid-1",
)
T0 = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)


class CountingProvider(TokenProvider):
    """Issues ``token-N`` valid for the requested lifetime from the test's clock."""

    def __init__(self, clock: list[datetime.datetime]) -> None:
        self.clock = clock
        self.calls = 0
        self.fail = False

    def request_token(self, request: TokenRequest) -> IssuedToken:
        if self.fail:
            raise TokenError("issuer down")
        self.calls += 1
        return IssuedToken(
            token=f"token-{self.calls}",
            expiration=self.clock[0] + datetime.timedelta(seconds=request.expiration_seconds),
            expiration_seconds=request.expiration_seconds,
        )


@pytest.fixture
def clock() -> list[datetime.datetime]:
    return [T0]


def manager(provider: TokenProvider, clock: list[datetime.datetime]) -> TokenManager:
    return TokenManager(provider, clock=lambda: clock[0], jitter=lambda: 0.0)


def test_token_is_cached_until_80_percent_of_its_lifetime(clock: list[datetime.datetime]) -> None:
    """Same token before 80%; a new one after."""
    provider = CountingProvider(clock)
    tokens = manager(provider, clock)
    assert tokens.get_token(REQUEST).token == "token-1"
    clock[0] = T0 + datetime.timedelta(seconds=799)
    assert tokens.get_token(REQUEST).token == "token-1"
    clock[0] = T0 + datetime.timedelta(seconds=801)
    assert tokens.get_token(REQUEST).token == "token-2"
    assert provider.calls == 2


def test_jitter_refreshes_up_to_ten_seconds_early(clock: list[datetime.datetime]) -> None:
    """With the largest jitter a token is refreshed 10 s before 80%."""
    provider = CountingProvider(clock)
    tokens = TokenManager(provider, clock=lambda: clock[0], jitter=lambda: 10.0)
    tokens.get_token(REQUEST)
    clock[0] = T0 + datetime.timedelta(seconds=791)
    assert tokens.get_token(REQUEST).token == "token-2"


def test_tokens_older_than_a_day_are_refreshed(clock: list[datetime.datetime]) -> None:
    """A 48-hour token is refreshed after 24 hours, not 38."""
    provider = CountingProvider(clock)
    tokens = manager(provider, clock)
    long = TokenRequest(namespace="ns", service_account="app", expiration_seconds=48 * 3600,
                        pod_name="web", pod_uid="uid-1")
    tokens.get_token(long)
    clock[0] = T0 + datetime.timedelta(hours=24, seconds=1)
    assert tokens.get_token(long).token == "token-2"


def test_failed_refresh_keeps_a_valid_token(clock: list[datetime.datetime]) -> None:
    """A refresh failure returns the cached token while it is valid, and fails after."""
    provider = CountingProvider(clock)
    tokens = manager(provider, clock)
    tokens.get_token(REQUEST)
    provider.fail = True
    clock[0] = T0 + datetime.timedelta(seconds=900)
    assert tokens.get_token(REQUEST).token == "token-1"
    clock[0] = T0 + datetime.timedelta(seconds=1001)
    with pytest.raises(TokenError, match="issuer down"):
        tokens.get_token(REQUEST)


def test_requests_are_cached_apart_and_forgotten_with_the_pod(
    clock: list[datetime.datetime],
) -> None:
    """Another audience is another token; forget_pod drops the pod's tokens."""
    provider = CountingProvider(clock)
    tokens = manager(provider, clock)
    other = TokenRequest(namespace="ns", service_account="app", audiences=("api",),
                         expiration_seconds=1000, pod_name="web", pod_uid="uid-1")
    assert tokens.get_token(REQUEST).token != tokens.get_token(other).token
    tokens.forget_pod("uid-1")
    assert tokens.get_token(REQUEST).token == "token-3"


def test_a_refresh_is_due_when_a_token_of_the_pod_would_be_renewed(
    clock: list[datetime.datetime],
) -> None:
    """refresh_due says what get_token would do for the pod's tokens: nothing known (a
    restart) or one past 80% of its life is due; tokens of other pods do not count."""
    tokens = manager(CountingProvider(clock), clock)
    assert tokens.refresh_due("uid-1")
    tokens.get_token(REQUEST)
    short = TokenRequest(namespace="ns", service_account="app", audiences=(),
                         expiration_seconds=100, pod_name="web", pod_uid="uid-1")
    tokens.get_token(short)
    tokens.get_token(TokenRequest(namespace="ns", service_account="app", audiences=(),
                                  expiration_seconds=10, pod_name="db", pod_uid="uid-2"))
    clock[0] = T0 + datetime.timedelta(seconds=79)
    assert not tokens.refresh_due("uid-1")
    clock[0] = T0 + datetime.timedelta(seconds=81)
    assert tokens.refresh_due("uid-1")  # the short one
    tokens.get_token(short)
    assert not tokens.refresh_due("uid-1")
    tokens.forget_pod("uid-1")
    assert tokens.refresh_due("uid-1")


def test_token_never_in_repr() -> None:
    """An IssuedToken's repr hides the token."""
    issued = IssuedToken(token="canary-token", expiration=T0, expiration_seconds=1)
    assert "canary-token" not in repr(issued)


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer() as server:
        yield server


def test_api_provider_uses_the_token_request_api(api: KubeAPIServer) -> None:
    """POST …/serviceaccounts/app/token with audiences, lifetime and the pod binding."""
    api.add_service_account("ns", "app")
    api.token_factory = lambda ns, sa, spec: "api-token"
    issued = APITokenProvider(api.api_client()).request_token(REQUEST)
    assert issued.token == "api-token"
    assert issued.expiration_seconds == 1000
    ((namespace, sa, body),) = api.token_requests
    assert (namespace, sa) == ("ns", "app")
    assert body["spec"]["audiences"] == ["vault"]
    assert body["spec"]["expirationSeconds"] == 1000
    assert body["spec"]["boundObjectRef"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "uid-1"}
    remaining = issued.expiration - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(seconds=990) < remaining <= datetime.timedelta(seconds=1000)


def test_api_provider_reports_a_missing_service_account(api: KubeAPIServer) -> None:
    """No such ServiceAccount: a TokenError with the API status."""
    with pytest.raises(TokenError, match="404"):
        APITokenProvider(api.api_client()).request_token(REQUEST)


def write_provider(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "provider.py"
    script.write_text(textwrap.dedent(body))
    return [sys.executable, str(script)]


def test_command_provider_gets_the_request_on_stdin(tmp_path: Path) -> None:
    """The command reads the TokenRequest and answers one with status.token."""
    argv = write_provider(tmp_path, """
        import json, sys
        req = json.load(sys.stdin)
        spec = req["spec"]
        token = "cmd-" + req["metadata"]["name"] + "-" + spec["boundObjectRef"]["uid"]
        print(json.dumps({"spec": spec, "status": {"token": token,
                          "expirationTimestamp": "2030-01-01T00:00:00Z"}}))
    """)
    issued = CommandTokenProvider(argv).request_token(REQUEST)
    assert issued.token == "cmd-app-uid-1"
    assert issued.expiration == datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def test_command_provider_failures_are_token_errors(tmp_path: Path) -> None:
    """Exit status, bad JSON and a missing token each raise TokenError, without a token."""
    failing = write_provider(tmp_path, "import sys; print('nope', file=sys.stderr); sys.exit(3)")
    with pytest.raises(TokenError, match=r"status 3 for .*: nope$"):
        CommandTokenProvider(failing).request_token(REQUEST)
    (tmp_path / "bad.py").write_text("print('not json canary-token')")
    with pytest.raises(TokenError, match="did not print a JSON") as info:
        CommandTokenProvider([sys.executable, str(tmp_path / "bad.py")]).request_token(REQUEST)
    assert "canary-token" not in str(info.value)
    (tmp_path / "empty.py").write_text("import json; print(json.dumps({'status': {}}))")
    with pytest.raises(TokenError, match=r"no status.token"):
        CommandTokenProvider([sys.executable, str(tmp_path / "empty.py")]).request_token(REQUEST)


def test_command_provider_default_expiry_is_the_requested_lifetime(tmp_path: Path) -> None:
    """Without an expirationTimestamp the token lives expirationSeconds from now."""
    argv = write_provider(tmp_path, f"print({json.dumps(json.dumps({'status': {'token': 't'}}))})")
    now = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
    issued = CommandTokenProvider(argv, clock=lambda: now).request_token(REQUEST)
    assert issued.expiration == now + datetime.timedelta(seconds=1000)


def test_stand_in_issuer_as_a_command() -> None:
    """``python3 -m kubevol.testing.token_provider`` answers with an unsigned JWT bound to
    the pod, for the service account and audience asked."""
    import base64

    provider = CommandTokenProvider([sys.executable, "-m", "kubevol.testing.token_provider"])
    issued = provider.request_token(REQUEST)
    _header, claims, signature = issued.token.split(".")
    assert signature == ""
    decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    assert decoded["sub"] == "system:serviceaccount:ns:app"
    assert decoded["aud"] == ["vault"]
    assert decoded["exp"] - decoded["iat"] == 1000
    assert decoded["kubernetes.io"]["pod"] == {"name": "web", "uid": "uid-1"}
    assert issued.expiration_seconds == 1000
