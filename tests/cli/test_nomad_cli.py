"""Covers kubevol.cli.nomad: ``kubevol nomad``.

``kubevol nomad``: register a real plugin (the bundled hostpath driver over gRPC) by its
socket, show it as ``nomad plugin status`` does, mount, expand and unmount a volume for
allocations with the per-allocation layout, on real mounts (as root, in a private mount
namespace)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csi.client import CSIClient
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.nomad.propagation import propagation_of
from kubevol.testing.mount_rig import mounts_under

#: Every test here mounts or otherwise needs root.
pytestmark = pytest.mark.root

MiB = 1 << 20
MULTI = ["--access-mode", "single-node-multi-writer"]
USAGE = "rw-file-system-single-node-multi-writer"


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """The agent state dir; whatever stays mounted under tmp_path is unmounted after."""
    if os.geteuid() != 0:
        pytest.fail("kubevol nomad mounts: run as root in `unshare -m`")
    yield tmp_path / "nomad"
    for path in reversed(mounts_under(tmp_path)):
        subprocess.run(["umount", "-l", path], check=False)


@pytest.fixture
def hostpath(tmp_path: Path) -> Iterator[str]:
    """The bundled hostpath driver (node id node-1) serving on a socket; its path."""
    socket_path = str(tmp_path / "hp.sock")
    config = HostPathConfig(state_dir=str(tmp_path / "hp"), node_id="node-1")
    with HostPathDriver(config).serve(f"unix://{socket_path}"):
        yield socket_path


def run(capsys: pytest.CaptureFixture[str], state: Path, *argv: str) -> tuple[int, str, str]:
    """``kubevol nomad ARGV --state-dir STATE``: (exit code, stdout, stderr)."""
    code = main(["nomad", *argv, "--state-dir", str(state)])
    out, err = capsys.readouterr()
    return code, out, err


def test_register_status_mount_expand_unmount_a_hostpath_volume(
    capsys: pytest.CaptureFixture[str], state: Path, hostpath: str
) -> None:
    """A registered plugin shows healthy with its node id and capabilities; two
    allocations mount one volume (staged once, published per allocation), its claims show
    in the status, it expands online after the controller grew it, and unmounting both
    leaves nothing mounted."""
    code, out, _ = run(capsys, state, "register", "--socket", hostpath, "-o", "json")
    assert code == 0
    registered = json.loads(out)
    assert registered["name"] == "hostpath.csi.kubevol.io"
    root = Path(registered["mount_root"])
    assert root == state / "csi" / "node" / "hostpath.csi.kubevol.io"
    name = registered["name"]

    code, out, _ = run(capsys, state, "status", "-o", "json")
    (plugin,) = json.loads(out)["plugins"]
    assert code == 0 and plugin["health"] == "healthy" and plugin["node_id"] == "node-1"
    assert plugin["requires_staging"] is True and "expand_volume" in plugin["capabilities"]
    code, out, _ = run(capsys, state, "status")
    assert out.split("\n")[0].split()[:4] == ["NAME", "TYPE", "HEALTH", "NODE"]
    assert f"{name}  csi-node  healthy  node-1" in out

    with CSIClient(hostpath, timeout=20) as client:
        created = client.create_volume(
            "data",
            [t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_MULTI_WRITER)],
            capacity_range=t.CapacityRange(required_bytes=MiB),
        )
    remote = ["--remote-id", created.volume_id, *MULTI]
    for alloc in ("alloc-a", "alloc-b"):
        code, out, err = run(capsys, state, "mount", name, "data", alloc, *remote, "-o", "json")
        assert code == 0, err
        assert json.loads(out)["path"] == str(root / "per-alloc" / alloc / "data" / USAGE)
    Path(root, "per-alloc", "alloc-a", "data", USAGE, "note").write_text("shared")
    assert Path(root, "per-alloc", "alloc-b", "data", USAGE, "note").read_text() == "shared"
    assert str(root / "staging" / "default" / "data" / USAGE) in mounts_under(root)
    code, out, _ = run(capsys, state, "status", "-o", "jsonpath={.plugins[0].volumes}")
    assert out == "2\n"

    with CSIClient(hostpath, timeout=20) as client:
        client.controller_expand_volume(created.volume_id, t.CapacityRange(required_bytes=2 * MiB))
    code, out, err = run(capsys, state, "expand", name, "data", "alloc-a", *remote,
                         "--size", "2Mi", "-o", "json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["capacity_bytes"] == 2 * MiB

    for alloc in ("alloc-a", "alloc-b"):
        code, _, err = run(capsys, state, "unmount", name, "data", alloc, *remote)
        assert code == 0, err
    assert mounts_under(root) == []
    assert run(capsys, state, "deregister", name)[0] == 0
    code, _, err = run(capsys, state, "status", name)
    assert code == exits.FAILED and "not registered" in err


def test_a_plugin_that_went_away_shows_unhealthy_and_cannot_mount(
    capsys: pytest.CaptureFixture[str], state: Path, tmp_path: Path
) -> None:
    """After its driver stopped, a registered plugin is reported with its last known
    name but not healthy, and a mount fails naming the plugin (exit 1), mounting nothing."""
    socket_path = str(tmp_path / "hp.sock")
    config = HostPathConfig(state_dir=str(tmp_path / "hp"), node_id="node-1")
    with HostPathDriver(config).serve(f"unix://{socket_path}"):
        code, _, _ = run(capsys, state, "register", "--socket", socket_path, "--name", "hp")
        assert code == 0
    code, out, _ = run(capsys, state, "status", "-o", "json", "-t", "2s")
    (plugin,) = json.loads(out)["plugins"]
    assert plugin["name"] == "hp" and plugin["health"] != "healthy"
    code, _, err = run(capsys, state, "mount", "hp", "data", "alloc-a", "-t", "2s")
    assert code == exits.FAILED and "'hp'" in err
    assert mounts_under(tmp_path) == []


def test_register_waits_for_a_socket_and_gives_up_naming_it(
    capsys: pytest.CaptureFixture[str], state: Path, tmp_path: Path
) -> None:
    """``register --wait`` on a socket nothing serves fails (exit 1) naming it."""
    missing = str(tmp_path / "none.sock")
    code, _, err = run(capsys, state, "register", "--socket", missing, "--wait", "0.3s")
    assert code == exits.FAILED and missing in err


def test_mount_waits_for_an_attachment_recorded_by_another_process(
    capsys: pytest.CaptureFixture[str], state: Path, tmp_path: Path
) -> None:
    """With a driver that needs ControllerPublish, ``mount --wait-attachment NODE`` waits
    for the attacher's record (``kubevol nomad attach``, here from a thread after the
    real ControllerPublishVolume) and mounts with its publish context."""
    socket_path = str(tmp_path / "hp.sock")
    config = HostPathConfig(state_dir=str(tmp_path / "hp"), node_id="node-1", enable_attach=True)
    with HostPathDriver(config).serve(f"unix://{socket_path}"):
        assert run(capsys, state, "register", "--socket", socket_path, "--name", "hp")[0] == 0
        cap = t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_WRITER)
        with CSIClient(socket_path, timeout=20) as client:
            created = client.create_volume("data", [cap])

        def attacher() -> None:
            time.sleep(0.3)
            with CSIClient(socket_path, timeout=20) as client:
                context = client.controller_publish_volume(created.volume_id, "node-1", cap)
            pairs = [f"--publish-context={k}={v}" for k, v in context.items()]
            assert main(["nomad", "attach", "data", "node-1", *pairs,
                         "--state-dir", str(state)]) == 0  # fmt: skip

        thread = threading.Thread(target=attacher)
        thread.start()
        wait = ["--remote-id", created.volume_id, "--wait-attachment", "node-1"]
        code, out, err = run(capsys, state, "mount", "hp", "data", "alloc-a", *wait, "-o", "json")
        thread.join()
        assert code == 0, err
        path = json.loads(out)["path"]
        assert path in mounts_under(tmp_path)
        assert run(capsys, state, "unmount", "hp", "data", "alloc-a",
                   "--remote-id", created.volume_id)[0] == 0  # fmt: skip
        assert run(capsys, state, "detach", "data", "node-1")[0] == 0
        code, _, err = run(capsys, state, "mount", "hp", "data", "alloc-b", *wait, "-t", "0.3s")
        assert code == exits.FAILED and "not attached within" in err
    assert mounts_under(tmp_path) == []


def test_a_plugin_in_a_task_gets_an_rshared_mount_root_and_the_mount_to_make(
    capsys: pytest.CaptureFixture[str], state: Path, hostpath: str
) -> None:
    """Registering a plugin that sees its directory elsewhere (a container path) makes the
    host directory an rshared mount and says how to mount it into the task."""
    code, out, err = run(capsys, state, "register", "--socket", hostpath, "--name", "hp",
                         "--plugin-mount-root", "/csi", "-o", "json")  # fmt: skip
    assert code == 0, err
    root = json.loads(out)["mount_root"]
    assert propagation_of(root) == "shared"
    assert f"mount {root} at /csi in the plugin's task with propagation rshared" in err
