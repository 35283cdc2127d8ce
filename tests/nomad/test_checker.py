"""Covers kubevol.nomad.checker.

The volume checker on real mounts: the plugin's volume condition where offered, the
mount and corrupted-mount checks otherwise."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.nomad import (
    CheckMethod,
    CSIManager,
    CSIVolume,
    PluginRegistry,
    UsageOptions,
    VolumeChecker,
    VolumeManager,
)
from kubevol.testing.mount_rig import mounts_under
from kubevol.testing.waiting import wait_until
from tests.nomad.conftest import PluginFactory

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

USAGE = UsageOptions()


@pytest.fixture
def manager(registry: PluginRegistry) -> Iterator[CSIManager]:
    """A running manager on the test registry."""
    mgr = CSIManager(registry, fingerprint_interval=0.2)
    mgr.run()
    yield mgr
    mgr.shutdown()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """The storage behind the volume."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "data").write_text("payload")
    return src


def mounted(
    plugins: PluginFactory,
    registry: PluginRegistry,
    manager: CSIManager,
    tmp_path: Path,
    source: Path,
    *args: str,
) -> VolumeManager:
    """Start a plugin with ``args``, mount volume ``vol`` for ``alloc-1``, return the mounter."""
    proc = plugins("checked", *args)
    registry.register(proc.registration(tmp_path / "root"))
    mounter = manager.mounter_for_plugin("checked", timeout=20)
    mounter.mount_volume(CSIVolume(id="vol", context={"source": str(source)}), "alloc-1", USAGE)
    return mounter


def test_condition_from_the_plugin_decides_when_offered(
    plugins: PluginFactory,
    registry: PluginRegistry,
    manager: CSIManager,
    tmp_path: Path,
    source: Path,
) -> None:
    """With VOLUME_CONDITION the plugin's verdict is used: normal, then abnormal with its
    message once the volume turns bad."""
    mounter = mounted(plugins, registry, manager, tmp_path, source, "--condition")
    checker = VolumeChecker(mounter)
    (good,) = checker.check_all()
    assert good.healthy and good.method is CheckMethod.VOLUME_CONDITION
    assert good.message == "volume is fine" and good.alloc_id == "alloc-1"
    (source / ".abnormal").write_text("")
    bad = checker.check("vol", "alloc-1", USAGE.to_fs())
    assert not bad.healthy and bad.method is CheckMethod.VOLUME_CONDITION
    assert bad.message == "marker file found"


def test_without_condition_the_mount_is_checked(
    plugins: PluginFactory,
    registry: PluginRegistry,
    manager: CSIManager,
    tmp_path: Path,
    source: Path,
) -> None:
    """No VOLUME_CONDITION: a mounted, answering target is healthy by the mount check; a
    target unmounted behind the agent's back is not."""
    mounter = mounted(plugins, registry, manager, tmp_path, source)
    checker = VolumeChecker(mounter)
    (good,) = checker.check_all()
    assert good.healthy and good.method is CheckMethod.MOUNT_CHECK
    subprocess.run(["umount", good.path], check=True)
    (bad,) = checker.check_all()
    assert not bad.healthy and bad.message == "target path is not mounted"


def test_corrupted_mount_is_unhealthy_and_mounting_again_repairs_it(
    plugins: PluginFactory,
    registry: PluginRegistry,
    manager: CSIManager,
    tmp_path: Path,
    source: Path,
) -> None:
    """A FUSE filesystem whose daemon died on the target: the checker reports the corrupted
    mount, and mounting the volume again unmounts the dead layer and serves data again."""
    mounter = mounted(plugins, registry, manager, tmp_path, source)
    checker = VolumeChecker(mounter)
    target = checker.check_all()[0].path
    fuse_src = tmp_path / "fuse-src"
    fuse_src.mkdir()
    daemon = subprocess.Popen(["bindfs", "-f", "-o", "nonempty", str(fuse_src), target])
    try:
        wait_until(lambda: mounts_under(Path(target)).count(target) == 2, what="bindfs")
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
    (bad,) = checker.check_all()
    assert not bad.healthy and bad.method is CheckMethod.MOUNT_CHECK
    assert "corrupted mount" in bad.message
    mounter.mount_volume(CSIVolume(id="vol", context={"source": str(source)}), "alloc-1", USAGE)
    assert Path(target, "data").read_text() == "payload"
    assert checker.check_all()[0].healthy
