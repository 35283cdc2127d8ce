"""The kubevol.csi package surface: light to import, lazy names resolve."""

from __future__ import annotations

import os
import subprocess
import sys


def test_importing_kubevol_csi_does_not_load_grpc() -> None:
    """``import kubevol.csi`` stays light: grpc and protobuf load on first use only."""
    code = (
        "import sys, kubevol.csi\n"
        "assert 'grpc' not in sys.modules, 'grpc imported'\n"
        "assert 'google.protobuf' not in sys.modules, 'protobuf imported'\n"
        "kubevol.csi.CSIClient\n"
        "assert 'grpc' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_lazy_names_are_the_real_objects() -> None:
    """kubevol.csi re-exports the client and the error classes; unknown names fail."""
    import pytest

    import kubevol.csi
    from kubevol.csi.client import CSIClient
    from kubevol.csi.errors import CSIRPCUncertainError

    assert kubevol.csi.CSIClient is CSIClient
    assert kubevol.csi.CSIRPCUncertainError is CSIRPCUncertainError
    with pytest.raises(AttributeError):
        _ = kubevol.csi.NoSuchThing


def _fork_support_after_import(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    if env_value is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = env_value
    code = ("import os, kubevol.csi.client, grpc\n"
            "print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_grpc_fork_handlers_are_off_unless_the_program_chose() -> None:
    """kubevol only forks to exec, and gRPC's fork handlers deadlocked a subprocess.run in
    fork() under load: importing kubevol.csi turns them off (gRPC's documented setting for
    fork+exec programs) before gRPC reads it, and keeps a program's own choice."""
    assert _fork_support_after_import(None) == "false"
    assert _fork_support_after_import("1") == "1"
