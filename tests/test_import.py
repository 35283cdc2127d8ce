"""Importing kubevol stays light."""

from __future__ import annotations

import subprocess
import sys


def test_import_kubevol_does_not_import_kubernetes() -> None:
    """`import kubevol` loads no kubernetes (or grpc) module."""
    code = (
        "import sys, kubevol; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'grpc')]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_kubevol_loads_names_on_first_use() -> None:
    """`import kubevol` loads no submodule but the version; each name loads its module."""
    code = (
        "import sys, kubevol; "
        "print(','.join(sorted(m for m in sys.modules if m.startswith('kubevol.')))); "
        "kubevol.Spec; print('kubevol.spec' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["kubevol._version", "True"]


def test_every_public_name_resolves_to_its_module() -> None:
    """``__all__`` and the lazy table name the same things, and each resolves."""
    import importlib

    import kubevol

    assert set(kubevol.__all__) == {"__version__", *kubevol._MODULE_OF}
    for name, module in kubevol._MODULE_OF.items():
        assert getattr(kubevol, name) is getattr(importlib.import_module(module), name)
    try:
        kubevol.NoSuchName  # type: ignore[attr-defined]  # noqa: B018  (mypy knows it is not there)
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_node_commands_load_no_http_client_until_an_etcd_provider_is_built() -> None:
    """The node commands (through the driver framework's configuration) load neither
    requests nor etcd3gw; building an etcd lock provider loads them."""
    code = (
        "import sys, kubevol.cli.down, kubevol.node.runtime, kubevol.csidriver.locks as locks; "
        "first = sorted(m for m in sys.modules if m.split('.')[0] in ('requests', 'etcd3gw')); "
        "locks.EtcdLockProvider(endpoints=['127.0.0.1:1']); "
        "print(first, 'requests' in sys.modules, 'etcd3gw' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True", "True"]
