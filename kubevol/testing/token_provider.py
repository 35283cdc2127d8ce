"""A stand-in service-account token issuer, for demos and tests without an API server.

It issues *unsigned* JWTs (``alg: none``) with the claims a real TokenRequest token carries
(issuer, subject ``system:serviceaccount:<ns>:<sa>``, audiences, ``iat``/``exp``, the bound
pod): they have the right shape for a volume, and are accepted by nothing. In-process it is
:class:`StandInTokenProvider`; as a command for ``kubevol up --token-provider`` it is the
console script ``kubevol-stand-in-token-provider`` installed with kubevol (kubevol finds it
next to its own scripts even when they are not on ``PATH``), or ``python -m
kubevol.testing.token_provider`` with the Python kubevol is installed in: TokenRequest JSON on
stdin, the answered TokenRequest on stdout.
"""

from __future__ import annotations

import base64
import datetime
import json
import sys
import uuid
from collections.abc import Callable

from kubevol.k8s.tokens import IssuedToken, TokenProvider, TokenRequest

ISSUER = "https://kubevol.invalid/stand-in-issuer"


def _b64url(data: dict[str, object]) -> str:
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unsigned_token(request: TokenRequest, now: datetime.datetime) -> str:
    """An unsigned JWT for ``request`` issued at ``now``."""
    issued = int(now.timestamp())
    claims = {
        "iss": ISSUER,
        "sub": f"system:serviceaccount:{request.namespace}:{request.service_account}",
        "aud": list(request.audiences) or [ISSUER],
        "iat": issued,
        "nbf": issued,
        "exp": issued + request.expiration_seconds,
        "jti": str(uuid.uuid4()),
        "kubernetes.io": {
            "namespace": request.namespace,
            "serviceaccount": {"name": request.service_account},
            "pod": {"name": request.pod_name, "uid": request.pod_uid},
        },
    }
    return f"{_b64url({'alg': 'none', 'typ': 'JWT'})}.{_b64url(claims)}."


class StandInTokenProvider(TokenProvider):
    """Issues :func:`unsigned_token` tokens valid for the requested lifetime."""

    def __init__(self, clock: Callable[[], datetime.datetime] | None = None) -> None:
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self.issued = 0

    def request_token(self, request: TokenRequest) -> IssuedToken:
        now = self._clock()
        self.issued += 1
        return IssuedToken(
            token=unsigned_token(request, now),
            expiration=now + datetime.timedelta(seconds=request.expiration_seconds),
            expiration_seconds=request.expiration_seconds,
        )


def main() -> int:
    """The command form (the console script ``kubevol-stand-in-token-provider``): a
    TokenRequest on stdin, the answered one on stdout."""
    body = json.load(sys.stdin)
    spec = body.get("spec") or {}
    ref = spec.get("boundObjectRef") or {}
    meta = body.get("metadata") or {}
    request = TokenRequest(
        namespace=str(meta.get("namespace") or "default"),
        service_account=str(meta.get("name") or "default"),
        audiences=tuple(spec.get("audiences") or ()),
        expiration_seconds=int(spec.get("expirationSeconds") or 3600),
        pod_name=str(ref.get("name") or ""),
        pod_uid=str(ref.get("uid") or ""),
    )
    issued = StandInTokenProvider().request_token(request)
    body["status"] = {
        "token": issued.token,
        "expirationTimestamp": issued.expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    json.dump(body, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
