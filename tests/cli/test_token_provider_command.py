"""Covers kubevol.cli.node_common's ``--token-provider`` and kubevol.k8s.tokens.

``--token-provider NAME``: a bare name not on ``PATH`` is found beside kubevol's own
scripts, so the stand-in issuer installed with kubevol works however kubevol was started."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from kubevol.cli.node_common import beside_kubevol
from kubevol.k8s.tokens import CommandTokenProvider, TokenRequest

STAND_IN = "kubevol-stand-in-token-provider"


def test_stand_in_issuer_is_found_off_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """With kubevol's scripts directory off ``PATH`` (sudo's reset ``PATH``), the console
    script installed with kubevol is found and issues a token bound to the pod."""
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    argv = beside_kubevol([STAND_IN])
    assert argv == [os.path.join(sysconfig.get_path("scripts"), STAND_IN)]
    request = TokenRequest(namespace="ns", service_account="sa", audiences=("demo",),
                           pod_name="web", pod_uid="u-1")  # fmt: skip
    issued = CommandTokenProvider(argv).request_token(request)
    _header, claims, signature = issued.token.split(".")
    padded = claims + "=" * (-len(claims) % 4)
    body = json.loads(base64.urlsafe_b64decode(padded))
    assert body["sub"] == "system:serviceaccount:ns:sa" and body["aud"] == ["demo"]
    assert body["kubernetes.io"]["pod"] == {"name": "web", "uid": "u-1"}
    assert signature == ""


def test_other_commands_are_left_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name on ``PATH``, a path, and a name found nowhere are run as given (the last
    then fails naming itself, as before)."""
    on_path = tmp_path / "issuer"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert beside_kubevol(["issuer", "-x"]) == ["issuer", "-x"]
    assert beside_kubevol(["./kubevol-stand-in-token-provider"]) == [
        "./kubevol-stand-in-token-provider"
    ]
    assert beside_kubevol(["no-such-issuer-anywhere"]) == ["no-such-issuer-anywhere"]
    assert beside_kubevol([]) == []


def test_module_form_still_works() -> None:
    """``python -m kubevol.testing.token_provider`` with kubevol's Python answers too."""
    body = {"metadata": {"name": "sa", "namespace": "ns"}, "spec": {"audiences": ["a"]}}
    done = subprocess.run(
        [sys.executable, "-m", "kubevol.testing.token_provider"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout)["status"]["token"].count(".") == 2
