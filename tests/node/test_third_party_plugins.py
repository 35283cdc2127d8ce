"""Covers kubevol.manager's entry-point plugins in kubevol.cli.node_common and the agent.

A third-party volume plugin installed from its own package (the ``kubevol.plugins``
entry-point group) is used by ``kubevol up``/``down`` and by the agent, and can be left out
(``--no-entry-points``) or picked by name (``--plugin``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kubevol.cli.main import main
from kubevol.node.agent import Agent
from kubevol.node.runtime import NodeRuntime

PLUGIN_NAME = "example.com/scratch"

# A plugin as a third party would write it: its own package, on kubevol's public bases; it
# serves flexVolume volumes of driver example.com/scratch by writing a marker file.
PLUGIN_SOURCE = '''
import os
from kubevol.plugin import VolumePlugin
from kubevol.types import Attributes, ReconstructedVolume
from kubevol.volume import Metrics, Mounter, Unmounter

NAME = "example.com/scratch"


class _Volume(Mounter, Unmounter):
    def __init__(self, path):
        self.path = path

    def get_path(self):
        return self.path

    def get_metrics(self):
        return Metrics()

    def can_mount(self):
        pass

    def set_up_at(self, directory, args):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "made-by-scratch"), "w") as f:
            f.write("hello")

    def get_attributes(self):
        return Attributes()

    def tear_down_at(self, directory):
        try:
            os.unlink(os.path.join(directory, "made-by-scratch"))
            os.rmdir(directory)
        except FileNotFoundError:
            pass


class ScratchPlugin(VolumePlugin):
    def init(self, host):
        self.host = host

    def get_plugin_name(self):
        return NAME

    def get_volume_name(self, spec):
        return spec.name()

    def can_support(self, spec):
        flex = getattr(spec.volume, "flex_volume", None) if spec.volume else None
        return flex is not None and flex.driver == NAME

    def _path(self, uid, name):
        return self.host.get_pod_volume_dir(uid, NAME, name)

    def new_mounter(self, spec, pod, opts):
        return _Volume(self._path(pod.metadata.uid, spec.name()))

    def new_unmounter(self, volume_name, pod_uid):
        return _Volume(self._path(pod_uid, volume_name))

    def construct_volume_spec(self, volume_name, volume_path):
        from kubevol.spec import Spec
        spec = Spec.from_manifest(
            {"name": volume_name, "flexVolume": {"driver": NAME}}
        )
        return ReconstructedVolume(spec=spec)


def plugins():
    return [ScratchPlugin()]
'''

UID = "0000000b-0000-4000-8000-000000000001"
POD = f"""
apiVersion: v1
kind: Pod
metadata: {{name: scratchy, namespace: default, uid: {UID}}}
spec:
  containers: [{{name: c, image: x}}]
  volumes:
  - {{name: notes, flexVolume: {{driver: {PLUGIN_NAME}}}}}
"""


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scratch package built and installed with pip into a directory of its own."""
    tmp_path = tmp_path_factory.mktemp("scratch-plugin")
    src = tmp_path / "src"
    (src / "kubevol_scratch").mkdir(parents=True)
    (src / "kubevol_scratch" / "__init__.py").write_text(PLUGIN_SOURCE)
    (src / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "kubevol-scratch"
        version = "0.1"

        [project.entry-points."kubevol.plugins"]
        scratch = "kubevol_scratch:plugins"
        """))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
         "--target", str(target), str(src)],
        check=True, capture_output=True,
    )
    return target


@pytest.fixture
def installed(site_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The installed package on sys.path (what an installed distribution is to
    importlib.metadata), for this test only."""
    monkeypatch.syspath_prepend(str(site_dir))
    return site_dir


@pytest.mark.root
def test_up_and_down_use_an_installed_plugin(
    installed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubevol up` mounts the volume through the third-party plugin, `--no-entry-points`
    leaves it out (no plugin matches), `--plugin NAME` picks it (and only it), `down`
    (all entry points, the default) tears it down."""
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(POD)
    root = str(tmp_path / "root")
    volume = f"{root}/pods/{UID}/volumes/example.com~scratch/notes"
    flags = ["--root", root, "--node-name", "n1"]

    assert main(["up", *flags, "--no-entry-points", str(manifest)]) != 0
    assert "no volume plugin matched" in capsys.readouterr().err
    assert not os.path.exists(volume)

    assert main(["up", *flags, "--plugin", PLUGIN_NAME, str(manifest)]) == 0
    with open(os.path.join(volume, "made-by-scratch")) as f:
        assert f.read() == "hello"

    capsys.readouterr()
    # Naming another plugin leaves the scratch one out: its pod can no longer be run.
    assert main(["up", *flags, "--plugin", "example.com/absent", str(manifest)]) != 0
    err = capsys.readouterr().err
    assert "no installed plugin is named 'example.com/absent'" in err
    assert "no volume plugin matched" in err

    assert main(["down", *flags, "--pod-uid", UID]) == 0
    assert not os.path.exists(volume)


@pytest.mark.slow
def test_the_agent_uses_an_installed_plugin(installed: Path, tmp_path: Path) -> None:
    """The agent loads entry-point plugins too: a static pod with the scratch volume runs."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    runtime = NodeRuntime(str(tmp_path / "root"), node_name="n1")
    assert runtime.plugin_problems == []
    agent = Agent(runtime, manifest_dir=str(manifests))
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        (manifests / "pod.yaml").write_text(POD)
        marker = tmp_path / f"root/pods/{UID}/volumes/example.com~scratch/notes/made-by-scratch"
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the scratch volume was never set up"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
        agent.close()
        runtime.close()
