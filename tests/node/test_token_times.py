"""Covers kubevol.node.token_times: refresh times saved by one run, read back by the next,
and a file that others could have written read as hostile input."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from kubevol.k8s.tokens import IssuedToken, TokenManager, TokenProvider, TokenRequest
from kubevol.node.token_times import TokenRefreshTimes

NOW = datetime.datetime.now(datetime.UTC)


class OneHourTokens(TokenProvider):
    def request_token(self, request: TokenRequest) -> IssuedToken:
        return IssuedToken(token="t", expiration_seconds=3600,
                           expiration=NOW + datetime.timedelta(hours=1))


def _manager() -> TokenManager:
    return TokenManager(OneHourTokens(), jitter=lambda: 0.0)


def _request(uid: str) -> TokenRequest:
    return TokenRequest(namespace="ns", service_account="sa", audiences=(),
                        expiration_seconds=3600, pod_name="p", pod_uid=uid)


def test_a_later_run_knows_when_the_tokens_are_due(tmp_path: Path) -> None:
    first = _manager()
    first.get_token(_request("uid-1"))
    times = TokenRefreshTimes(str(tmp_path))
    times.save_if_changed(first)
    saved = json.loads(Path(times.path).read_text())
    assert set(saved) == {"uid-1"}  # the time only, never a token
    later = _manager()
    assert later.refresh_due("uid-1") and later.refresh_due("uid-2")  # nothing known
    TokenRefreshTimes(str(tmp_path)).load(later)
    assert not later.refresh_due("uid-1") and later.refresh_due("uid-2")


def test_a_hostile_or_broken_file_cannot_put_a_renewal_off(tmp_path: Path) -> None:
    times = TokenRefreshTimes(str(tmp_path))
    Path(times.path).parent.mkdir(parents=True)
    far = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)).isoformat()
    Path(times.path).write_text(json.dumps(
        {"uid-1": far, "uid-2": "not a time", "uid-3": "2030-01-01T00:00:00"}))
    tokens = _manager()
    times.load(tokens)
    # No later than a token may go unrenewed (24 hours); no time without a zone.
    latest = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=24)
    assert tokens.refresh_times()["uid-1"] <= latest
    assert tokens.refresh_due("uid-2") and tokens.refresh_due("uid-3")
    Path(times.path).write_text("[1, 2")
    broken = _manager()
    TokenRefreshTimes(str(tmp_path)).load(broken)
    assert broken.refresh_due("uid-1")
