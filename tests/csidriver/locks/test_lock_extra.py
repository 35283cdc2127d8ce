"""Covers kubevol.csidriver.locks without its etcd extra.

The etcd lock provider is an optional extra: without etcd3gw, everything else works and
asking for the provider names the extra to install."""

from __future__ import annotations

import subprocess
import sys


def test_missing_etcd3gw_names_the_extra() -> None:
    """With etcd3gw absent, the in-process provider works and the etcd one raises
    LockProviderError saying ``pip install 'kubevol[etcd]'``."""
    code = """
import sys
for name in ("etcd3gw", "etcd3gw.client", "etcd3gw.exceptions"):
    sys.modules[name] = None  # as if the extra were not installed
from kubevol.csidriver.locks import InProcessLockProvider, LockProviderError, lock_provider_from_env
env = {"X_CSI_SERIAL_VOL_ACCESS": "true"}
assert isinstance(lock_provider_from_env(env), InProcessLockProvider)
env["X_CSI_SERIAL_VOL_ACCESS_ETCD_ENDPOINTS"] = "http://127.0.0.1:2379"
try:
    lock_provider_from_env(env)
except LockProviderError as exc:
    print(exc)
else:
    raise SystemExit("the etcd provider was built without etcd3gw")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert "pip install 'kubevol[etcd]'" in out
