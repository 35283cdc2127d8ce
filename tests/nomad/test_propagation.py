"""Covers kubevol.nomad.propagation and kubevol.nomad.supervisor.

Mount propagation for plugins run as tasks: the supervisor makes the plugin's directory
an rshared mount, so the mounts a node plugin makes inside its own mount namespace (a
container's view of that directory) appear on the host, where the agent and other tasks
find them. Real mounts, real namespaces (``unshare -m``), a real plugin process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubevol.nomad import (
    CSIManager,
    CSIVolume,
    MountPropagation,
    PluginRegistry,
    PluginSupervisor,
    PluginTaskConfig,
    PluginType,
    UsageOptions,
)
from kubevol.nomad.propagation import propagation_of
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.nomad.conftest import accepts

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root


def in_task_namespace(root: Path, view: Path, then: str) -> list[str]:
    """The command that runs ``then`` (a shell command) as a plugin task would: in a mount
    namespace of its own, with the plugin directory ``root`` mounted at ``view`` (a bind
    keeps the propagation of the host side: shared stays shared)."""
    script = f'mount --bind "{root}" "{view}" && {then}'
    return ["unshare", "-m", "--propagation", "unchanged", "sh", "-c", script]


@pytest.fixture
def task_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """The plugin directory on the host and the (empty) directory the task sees it at."""
    root, view = tmp_path / "csi" / "node" / "hp", tmp_path / "task-view"
    view.mkdir()
    return root, view


def supervisor(
    registry: PluginRegistry, root: Path, view: Path, propagation: MountPropagation
) -> PluginSupervisor:
    """A supervisor of a node plugin task whose directory is ``root`` (seen at ``view``)."""
    config = PluginTaskConfig(
        plugin_id="hp", plugin_type=PluginType.CSI_NODE, alloc_id="plugin-alloc",
        mount_root=str(root), plugin_mount_root=str(view), mount_propagation=propagation,
        probe_interval=0.1, heartbeat_interval=0.2,
    )  # fmt: skip
    return PluginSupervisor(config, registry)


def test_a_mount_made_inside_the_task_appears_on_the_host(
    registry: PluginRegistry, task_dirs: tuple[Path, Path]
) -> None:
    """After prepare(), the plugin directory is an rshared mount; a tmpfs mounted by the
    task under its view of the directory is a mount point on the host, with its files.
    prepare() is idempotent, and task_mounts() tells the runtime to mount it rshared."""
    root, view = task_dirs
    sup = supervisor(registry, root, view, MountPropagation.BIDIRECTIONAL)
    sup.prepare()
    sup.prepare()
    assert propagation_of(str(root)) == "shared"
    assert mounts_under(root) == [str(root)]  # one self-bind, however often prepared
    (mount,) = sup.task_mounts()
    assert (mount.host_path, mount.task_path) == (str(root), str(view))
    assert mount.propagation.runtime_name == "rshared"
    inside = view / "staging" / "default" / "vol"
    subprocess.run(
        in_task_namespace(root, view, f'mkdir -p "{inside}" && mount -t tmpfs task "{inside}" '
                          f'&& echo from-task > "{inside}/file"'),
        check=True,
    )  # fmt: skip
    on_host = root / "staging" / "default" / "vol"
    assert str(on_host) in mounts_under(root)
    assert (on_host / "file").read_text() == "from-task\n"


def test_without_propagation_the_tasks_mounts_stay_in_the_task(
    registry: PluginRegistry, task_dirs: tuple[Path, Path]
) -> None:
    """With propagation "private" the host side is left alone (not even bound), and the
    task's mount never reaches the host: what a node plugin would suffer without it."""
    root, view = task_dirs
    sup = supervisor(registry, root, view, MountPropagation.PRIVATE)
    sup.prepare()
    assert propagation_of(str(root)) is None
    inside = view / "staging" / "vol"
    subprocess.run(
        in_task_namespace(root, view, f'mkdir -p "{inside}" && mount -t tmpfs task "{inside}"'),
        check=True,
    )
    assert mounts_under(root) == []
    assert (root / "staging" / "vol").is_dir()  # the directory, not the mount


def test_a_node_plugin_run_as_a_task_stages_and_publishes_for_the_host(
    registry: PluginRegistry,
    task_dirs: tuple[Path, Path],
    sock_dir: Path,
    tmp_path: Path,
    volume_source: Path,
) -> None:
    """End to end: the supervisor prepares the directory, the test driver runs in its own
    mount namespace seeing it at another path, the supervisor registers it once healthy;
    the manager's mount, which checks the host paths, then finds the plugin's staging and
    publish mounts on the host, and its unmount sees them go."""
    root, view = task_dirs
    socket_path = str(sock_dir / "task.sock")
    config = PluginTaskConfig(
        plugin_id="hp", plugin_type=PluginType.CSI_NODE, alloc_id="plugin-alloc",
        mount_root=str(root), plugin_mount_root=str(view), socket_path=socket_path,
        probe_interval=0.1, heartbeat_interval=0.2,
    )  # fmt: skip
    sup = PluginSupervisor(config, registry)
    sup.prepare()
    driver = (
        f'exec "{sys.executable}" -m kubevol.testing.csi_driver --endpoint "{socket_path}" '
        f'--name hp --mode node --state-dir "{tmp_path / "driver-state"}"'
    )
    task = subprocess.Popen(in_task_namespace(root, view, driver), env=os.environ)
    manager = CSIManager(registry, fingerprint_interval=0.5, state_dir=str(tmp_path / "state"))
    try:
        wait_until(lambda: accepts(socket_path), 20, socket_path)
        sup.start()
        assert sup.wait_registered(20)
        manager.run()
        mounter = manager.mounter_for_plugin("hp", timeout=20)
        usage = UsageOptions()
        volume = CSIVolume(id="v", context={"source": str(volume_source)})
        info = mounter.mount_volume(volume, "a1", usage)
        staged = root / "staging" / "default" / "v" / usage.to_fs()
        assert info.source == str(root / "per-alloc" / "a1" / "v" / usage.to_fs())
        assert {str(staged), info.source} <= set(mounts_under(root))
        assert Path(info.source, "hello").read_text() == "hello from the volume"
        mounter.unmount_volume("v", "", "a1", usage)
        assert mounts_under(root) == [str(root)]
    finally:
        manager.shutdown()
        sup.stop()
        task.terminate()
        task.wait(10)
