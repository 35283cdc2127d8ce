"""Covers kubevol.nomad.volumes and kubevol.nomad.claims.

The volume mounter against a real plugin process doing real bind mounts: paths on disk,
staging only when advertised, idempotency, serialisation, retries, and the usage tracker
across agent restarts (hashicorp/nomad#25813)."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import grpc
import pytest

from kubevol.csi.errors import CSIRPCError
from kubevol.errors import InvalidPathSegmentError, UncertainProgressError
from kubevol.nomad import (
    AccessMode,
    AttachmentMode,
    CSIManager,
    CSIVolume,
    PluginRegistry,
    RetryPolicy,
    UsageOptions,
    VolumeKey,
    VolumeManager,
)
from kubevol.testing.mount_rig import mounts_under
from kubevol.util.backoff import Backoff
from tests.nomad.conftest import PluginFactory, PluginProcess

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

RW = UsageOptions(
    read_only=False,
    attachment_mode=AttachmentMode.FILE_SYSTEM,
    access_mode=AccessMode.SINGLE_NODE_WRITER,
)
USAGE = "rw-file-system-single-node-writer"


class Agent:
    """A node agent's CSI side: a registry and a manager on persisted state, restartable."""

    def __init__(self, tmp_path: Path, *, persist_usage: bool = True) -> None:
        self.registry_path = str(tmp_path / "state" / "registry.json")
        self.state_dir = str(tmp_path / "state") if persist_usage else None
        self.retry = RetryPolicy(timeout=10, backoff=Backoff(initial=0.01, maximum=0.1))
        self.manager: CSIManager | None = None
        self.start()

    @property
    def registry(self) -> PluginRegistry:
        """The running manager's registry."""
        assert self.manager is not None
        return self.manager.registry

    def start(self) -> None:
        """Build a registry from the state file and run a new manager on it."""
        self.manager = CSIManager(
            PluginRegistry(self.registry_path),
            fingerprint_interval=0.2,
            state_dir=self.state_dir,
            retry=self.retry,
        )
        self.manager.run()

    def restart(self) -> None:
        """Shut the manager down (volumes stay mounted) and start a fresh one."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """Shut the manager down. Idempotent."""
        if self.manager is not None:
            self.manager.shutdown()
            self.manager.registry.close()
            self.manager = None

    def mounter(self, name: str = "hostpath") -> VolumeManager:
        """The plugin's mounter (after its first fingerprint)."""
        assert self.manager is not None
        return self.manager.mounter_for_plugin(name, timeout=20)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    """An agent with persisted registry and usage state; stopped afterwards."""
    a = Agent(tmp_path)
    yield a
    a.stop()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A directory standing for the storage behind the volume, with one file."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "hello").write_text("hello from the volume")
    return src


def start_plugin(plugins: PluginFactory, agent: Agent, root: Path, *args: str) -> PluginProcess:
    """Start a plugin process named hostpath and register it with the agent."""
    proc = plugins("hostpath", *args)
    agent.registry.register(proc.registration(root))
    return proc


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is in the mount table."""
    return str(path) in mounts_under(path.parent)


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def test_paths_on_disk_are_exactly_the_layout(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """Staging at <root>/staging/<ns>/<vol>/<usage>, publishing at
    <root>/per-alloc/<alloc>/<vol>/<usage>, both real bind mounts; unmount removes them."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root)
    mounter = agent.mounter()
    volume = CSIVolume(id="vol1", namespace="prod", context={"source": str(source)})
    info = mounter.mount_volume(volume, "alloc-a", RW, {"attach": "done"})

    staging = root / "staging" / "prod" / "vol1" / USAGE
    target = root / "per-alloc" / "alloc-a" / "vol1" / USAGE
    assert RW.to_fs() == USAGE
    assert info.source == str(target) and not info.is_device
    assert is_mounted(staging) and is_mounted(target)
    assert (target / "hello").read_text() == "hello from the volume"
    assert tree(root) == [
        "per-alloc",
        "per-alloc/alloc-a",
        "per-alloc/alloc-a/vol1",
        f"per-alloc/alloc-a/vol1/{USAGE}",
        f"per-alloc/alloc-a/vol1/{USAGE}/hello",
        "staging",
        "staging/prod",
        "staging/prod/vol1",
        f"staging/prod/vol1/{USAGE}",
        f"staging/prod/vol1/{USAGE}/hello",
    ]
    (stage,) = proc.calls("NodeStageVolume")
    (publish,) = proc.calls("NodePublishVolume")
    assert stage["path"] == str(staging)
    assert publish["path"] == str(target) and publish["staging"] == str(staging)

    mounter.unmount_volume("vol1", "", "alloc-a", RW, namespace="prod")
    assert mounts_under(root) == []
    assert tree(root) == ["per-alloc", "staging"]
    assert [c["rpc"] for c in proc.calls() if c["rpc"].startswith("NodeUn")] == [
        "NodeUnpublishVolume",
        "NodeUnstageVolume",
    ]


def test_plugin_without_stage_unstage_is_only_published(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """No STAGE_UNSTAGE_VOLUME: no NodeStage/NodeUnstage, no staging directory, and the
    publish carries no staging path."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root, "--no-stage")
    mounter = agent.mounter()
    assert not mounter.requires_staging
    volume = CSIVolume(id="vol1", context={"source": str(source)})
    info = mounter.mount_volume(volume, "alloc-a", RW)
    assert Path(info.source, "hello").exists()
    assert not (root / "staging").exists()
    (publish,) = proc.calls("NodePublishVolume")
    assert publish["staging"] == ""
    mounter.unmount_volume("vol1", "", "alloc-a", RW)
    assert proc.calls("NodeStageVolume") == proc.calls("NodeUnstageVolume") == []
    assert mounts_under(root) == []


def test_read_only_usage_gets_its_own_paths_and_a_read_only_mount(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """A read-only usage is staged and published under ro-... and cannot be written."""
    root = tmp_path / "root"
    start_plugin(plugins, agent, root)
    mounter = agent.mounter()
    usage = UsageOptions(read_only=True, access_mode=AccessMode.MULTI_NODE_READER_ONLY)
    volume = CSIVolume(id="vol1", context={"source": str(source)})
    info = mounter.mount_volume(volume, "alloc-r", usage)
    assert info.source == str(
        root / "per-alloc" / "alloc-r" / "vol1" / "ro-file-system-multi-node-reader-only"
    )
    with pytest.raises(OSError) as err:
        Path(info.source, "new").write_text("x")
    assert err.value.errno == errno.EROFS
    mounter.unmount_volume("vol1", "", "alloc-r", usage)


def test_mounting_again_is_skipped_when_paths_are_mount_points(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """A second mount of the same volume for the same allocation makes no RPC."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root)
    mounter = agent.mounter()
    volume = CSIVolume(id="vol1", context={"source": str(source)})
    first = mounter.mount_volume(volume, "alloc-a", RW)
    before = len(proc.calls())
    assert mounter.mount_volume(volume, "alloc-a", RW) == first
    assert len(proc.calls()) == before
    assert mounter.has_mount(first)
    mounter.unmount_volume("vol1", "", "alloc-a", RW)
    assert not mounter.has_mount(first)


@pytest.mark.parametrize("persist_usage", [True, False], ids=["persisted", "rebuilt"])
def test_shared_volume_survives_agent_restarts_until_its_last_user(
    plugins: PluginFactory, source: Path, tmp_path: Path, persist_usage: bool
) -> None:
    """Two allocations share one staged volume, the agent restarting between each step:
    the volume is unstaged only when both are gone (nomad#25813). Claims come from the
    persisted state, or are rebuilt from the per-alloc mounts when nothing was persisted."""
    agent = Agent(tmp_path, persist_usage=persist_usage)
    try:
        root = tmp_path / "root"
        proc = start_plugin(plugins, agent, root)
        volume = CSIVolume(id="shared", namespace="ns1", context={"source": str(source)})
        staging = root / "staging" / "ns1" / "shared" / USAGE
        target_a = agent.mounter().mount_volume(volume, "alloc-a", RW).source

        agent.restart()
        target_b = agent.mounter().mount_volume(volume, "alloc-b", RW).source
        assert len(proc.calls("NodeStageVolume")) == 1  # the staged mount was re-used

        agent.restart()
        agent.mounter().unmount_volume("shared", "", "alloc-a", RW, namespace="ns1")
        assert proc.calls("NodeUnstageVolume") == []
        assert is_mounted(staging) and not os.path.exists(target_a)
        assert Path(target_b, "hello").read_text() == "hello from the volume"

        agent.restart()
        mounter = agent.mounter()
        key = VolumeKey(namespace="ns1", volume_id="shared", usage=USAGE)
        assert mounter.state.tracker.users(key) == {"alloc-b"}
        mounter.unmount_volume("shared", "", "alloc-b", RW, namespace="ns1")
        assert len(proc.calls("NodeUnstageVolume")) == 1
        assert proc.calls()[-1]["rpc"] == "NodeUnstageVolume"
        assert mounts_under(root) == []
    finally:
        agent.stop()


def test_concurrent_operations_on_one_volume_are_serialised(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """Eight allocations mounting one volume at once stage it once; unmounting them all at
    once unstages it once, after the last unpublish."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root)
    mounter = agent.mounter()
    volume = CSIVolume(id="vol1", context={"source": str(source)})
    allocs = [f"alloc-{i}" for i in range(8)]
    errors: list[BaseException] = []

    def run_all(action: str) -> None:
        def one(alloc: str) -> None:
            try:
                if action == "mount":
                    mounter.mount_volume(volume, alloc, RW)
                else:
                    mounter.unmount_volume("vol1", "", alloc, RW)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(a,)) for a in allocs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    run_all("mount")
    assert errors == []
    assert len(proc.calls("NodeStageVolume")) == 1
    assert len(proc.calls("NodePublishVolume")) == 8
    run_all("unmount")
    assert errors == []
    rpcs = [c["rpc"] for c in proc.calls() if c["rpc"].startswith("NodeUn")]
    assert rpcs == ["NodeUnpublishVolume"] * 8 + ["NodeUnstageVolume"]
    assert mounts_under(root) == []
    assert mounter.state.serializer.busy() == 0


def test_transient_failures_are_retried_until_success(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """NodeStageVolume answering UNAVAILABLE twice is tried a third time and succeeds."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root, "--fail", "NodeStageVolume=UNAVAILABLE:2")
    mounter = agent.mounter()
    volume = CSIVolume(id="vol1", context={"source": str(source)})
    mounter.mount_volume(volume, "alloc-a", RW)
    assert len(proc.calls("NodeStageVolume")) == 3
    mounter.unmount_volume("vol1", "", "alloc-a", RW)


def test_final_failure_is_not_retried_and_frees_the_claim(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """A final error (INVALID_ARGUMENT) on publish is raised after one call; the claim this
    mount made is dropped, so cleaning up unstages the volume."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root, "--fail", "NodePublishVolume=INVALID_ARGUMENT")
    mounter = agent.mounter()
    volume = CSIVolume(id="vol1", context={"source": str(source)})
    with pytest.raises(CSIRPCError) as err:
        mounter.mount_volume(volume, "alloc-a", RW)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert len(proc.calls("NodePublishVolume")) == 1
    assert mounter.state.tracker.claims() == {}
    mounter.unmount_volume("vol1", "", "alloc-a", RW)
    assert len(proc.calls("NodeUnstageVolume")) == 1
    assert mounts_under(root) == []


def test_retries_stop_when_the_time_budget_is_spent(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """A plugin answering UNAVAILABLE forever: the mount fails, uncertain, once the budget
    is spent, keeping its claim until the allocation is unmounted."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root, "--fail", "NodeStageVolume=UNAVAILABLE")
    agent.retry = RetryPolicy(timeout=0.5, backoff=Backoff(initial=0.05, maximum=0.1))
    agent.restart()
    mounter = agent.mounter()
    with pytest.raises(CSIRPCError) as err:
        mounter.mount_volume(CSIVolume(id="vol1", context={"source": str(source)}), "a", RW)
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert isinstance(err.value, UncertainProgressError)
    calls = proc.calls("NodeStageVolume")
    assert 3 <= len(calls) <= 12
    assert calls[-1]["t"] - calls[0]["t"] < 1.0  # far below the 2-minute default budget
    # The stage may have happened: the claim stays until the allocation's unmount.
    key = VolumeKey(namespace="default", volume_id="vol1", usage=USAGE)
    assert mounter.state.tracker.users(key) == {"a"}
    mounter.unmount_volume("vol1", "", "a", RW)
    assert mounter.state.tracker.claims() == {}
    assert len(proc.calls("NodeUnstageVolume")) == 1


def test_names_that_would_escape_the_root_are_refused(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """Volume ids, namespaces and allocation ids are path segments: '..' and '/' refused
    before anything is created."""
    root = tmp_path / "root"
    proc = start_plugin(plugins, agent, root)
    mounter = agent.mounter()
    with pytest.raises(InvalidPathSegmentError):
        CSIVolume(id="../etc", context={"source": str(source)})
    with pytest.raises(InvalidPathSegmentError):
        CSIVolume(id="v", namespace="a/b")
    with pytest.raises(InvalidPathSegmentError):
        mounter.mount_volume(CSIVolume(id="v"), "..", RW)
    with pytest.raises(InvalidPathSegmentError):
        mounter.unmount_volume("v", "", "a/../../b", RW)
    assert proc.calls("NodeStageVolume") == []
    assert not (root / "staging").exists()


def test_plugin_is_sent_paths_under_the_root_as_it_sees_it(
    plugins: PluginFactory, agent: Agent, source: Path, tmp_path: Path
) -> None:
    """A plugin that sees the mount root elsewhere (a container's /local/csi; here a shared
    bind mount of the root) is sent paths under its view, while the agent checks and
    reports the host paths, where the mounts propagate."""
    root = tmp_path / "root"
    view = tmp_path / "plugin-view"
    root.mkdir()
    view.mkdir()
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "--make-shared", str(root)], check=True)
    subprocess.run(["mount", "--bind", str(root), str(view)], check=True)
    proc = plugins("hostpath")
    agent.registry.register(attrs.evolve(proc.registration(root), plugin_mount_root=str(view)))
    mounter = agent.mounter()
    volume = CSIVolume(id="vol1", context={"source": str(source)})
    info = mounter.mount_volume(volume, "alloc-a", RW)
    assert info.source == str(root / "per-alloc" / "alloc-a" / "vol1" / USAGE)
    assert Path(info.source, "hello").exists() and mounter.has_mount(info)
    (stage,) = proc.calls("NodeStageVolume")
    (publish,) = proc.calls("NodePublishVolume")
    assert stage["path"] == str(view / "staging" / "default" / "vol1" / USAGE)
    assert publish["path"] == str(view / "per-alloc" / "alloc-a" / "vol1" / USAGE)
    assert publish["staging"] == stage["path"]
    before = len(proc.calls())
    mounter.mount_volume(volume, "alloc-a", RW)  # host paths are mounted: no call
    assert len(proc.calls()) == before
    mounter.unmount_volume("vol1", "", "alloc-a", RW)
    assert (proc.calls()[-1]["path"]) == stage["path"]
    assert mounts_under(root / "staging") == mounts_under(root / "per-alloc") == []
