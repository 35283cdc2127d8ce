"""Covers kubevol.cli.kubernetes_package: the command line's process loads the kubernetes
package's parts on use, so a command that builds pods loads the client without ``config``
and the rest; a program that imports kubevol keeps the package as its ``__init__`` makes it.

Each check runs in a fresh interpreter: this one imported the package long ago."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run_python(code: str, *argv: str, flags: tuple[str, ...] = ()
               ) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter (with ``flags``) running ``code`` with arguments ``argv``."""
    return subprocess.run([sys.executable, *flags, "-c", code, *argv], capture_output=True,
                          text=True, timeout=120, check=False)


def test_each_part_loads_when_first_named() -> None:
    proc = run_python(
        "import sys\n"
        "from kubevol.cli.kubernetes_package import load_parts_on_use\n"
        "load_parts_on_use()\n"
        "import kubernetes.client.models.v1_pod\n"
        "print('config' , 'kubernetes.config' in sys.modules)\n"
        "from kubernetes import config\n"
        "import kubernetes\n"
        "print('loaded', callable(config.load_kube_config), kubernetes.watch.Watch.__name__)\n"
        "print('missing', hasattr(kubernetes, 'no_such_part'))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["config False", "loaded True Watch", "missing False"]


def test_a_program_that_calls_main_keeps_the_package_whole() -> None:
    """``main(argv)`` (a test, a program) leaves the package to its ``__init__``."""
    proc = run_python(
        "from kubevol.cli.main import main\n"
        "main(['plugins', '-o', 'json'])\n"
        "import sys, kubernetes\n"
        "print(kubernetes.__version__, 'kubernetes.config' in sys.modules, file=sys.stderr)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.split()[-1] == "True"


@pytest.mark.root
def test_a_command_that_builds_a_pod_loads_the_client_alone(tmp_path: Path) -> None:
    """``kubevol up`` of a pod with an emptyDir, as a process of its own: its imports
    (``-X importtime``) hold ``kubernetes.client`` and not ``kubernetes.config``, which the
    package's ``__init__`` imports (0.2 s here)."""
    pod = tmp_path / "pod.json"
    pod.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default",
                     "uid": "00000000-0000-4000-8000-000000000001"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "scratch", "emptyDir": {}}]},
    }))
    root = str(tmp_path / "root")
    cli = "from kubevol.cli.main import main; main()"
    up = run_python(cli, "up", "--root", root, str(pod), flags=("-X", "importtime"))
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in up.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "kubernetes.client" in imported
        assert "kubernetes.config" not in imported
    finally:
        down = run_python(cli, "down", "--root", root, str(pod))
        assert down.returncode == 0, down.stderr
