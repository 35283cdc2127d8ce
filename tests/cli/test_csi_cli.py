"""Covers kubevol.cli.csi: every ``kubevol csi`` command group.

``kubevol csi``: every command group against the bundled drivers over real sockets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from kubevol.cli import exits
from kubevol.cli.csi.inputs import parse_capability
from kubevol.cli.main import main
from kubevol.csi import types as t
from kubevol.csidriver.drivers.common import serve_plugin
from kubevol.csidriver.drivers.hostpath import HostPathConfig, HostPathDriver
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver
from kubevol.csidriver.sanity.inputs import load_secrets
from kubevol.mount.mountinfo import parse_mountinfo
from kubevol.testing.csi_driver import FakeCSIDriver


class CLI:
    """Runs ``kubevol`` in-process and captures what it prints."""

    def __init__(self, capsys: pytest.CaptureFixture[str], endpoint: str) -> None:
        self.capsys = capsys
        self.endpoint = endpoint

    def run(self, *args: str) -> tuple[int, str, str]:
        """``kubevol ARGS`` with ``--endpoint`` appended; (exit code, stdout, stderr)."""
        code = main([*args, "--endpoint", self.endpoint])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        """Run with ``-o json``, require success and parse the output."""
        code, out, err = self.run(*args, "-o", "json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def mock_cli(capsys: pytest.CaptureFixture[str]) -> Iterator[CLI]:
    """The CLI pointed at a mock driver that creates target paths (GetSnapshot on)."""
    config = MockConfig(node_id="node-1")
    caps = config.controller_caps | {t.ControllerCapability.GET_SNAPSHOT}
    with MockDriver(attrs.evolve(config, controller_caps=caps)).serve() as running:
        yield CLI(capsys, running.endpoint)


def test_identity_commands(mock_cli: CLI) -> None:
    """plugin-info, plugin-capabilities and probe print what the driver answers."""
    assert mock_cli.json("csi", "identity", "plugin-info")["name"] == "mock.csi.kubevol.io"
    caps = mock_cli.json("csi", "identity", "plugin-capabilities")
    assert "CONTROLLER_SERVICE" in caps["services"] and caps["volume_expansion"] == ["ONLINE"]
    assert mock_cli.json("csi", "identity", "probe") == {"ready": True}
    code, out, _ = mock_cli.run("csi", "identity", "plugin-info")
    assert code == 0 and out.splitlines()[0].split() == ["NAME", "VENDOR", "VERSION", "MANIFEST"]


def test_controller_commands(mock_cli: CLI) -> None:
    """Every controller command, from create-volume to delete-volume."""
    run = mock_cli.json
    cap = "single-node-writer,mount,ext4,noatime"
    [vol] = run(
        "csi", "controller", "create-volume", "v1", "--cap", cap,
        "--req-bytes", "2Gi", "--params", "tier=gold",
    )  # fmt: skip
    vid = vol["volume_id"]
    assert vol["capacity_bytes"] == 2 << 30
    listed = run("csi", "controller", "list-volumes", "--max-entries", "1", "--paging")
    assert [e["volume"]["volume_id"] for e in listed] == [vid]
    got = run("csi", "controller", "get-volume", vid)
    assert got["volume"]["volume_id"] == vid
    valid = run("csi", "controller", "validate-volume-capabilities", vid, "--cap", "1,2")
    assert valid["confirmed"] is not None
    expanded = run("csi", "controller", "expand-volume", vid, "--req-bytes", "3Gi")
    assert expanded["capacity_bytes"] == 3 << 30
    assert run("csi", "controller", "modify-volume", vid, "--mutable-params", "iops=5")["modified"]
    capacity = run("csi", "controller", "get-capacity")
    assert capacity["available_capacity"] > 0
    assert "GET_SNAPSHOT" in run("csi", "controller", "get-capabilities")
    [pub] = run("csi", "controller", "publish", vid, "--node-id", "node-1")
    assert pub["publish_context"]
    run("csi", "controller", "unpublish", vid, "--node-id", "node-1")
    [snap] = run("csi", "controller", "create-snapshot", "s1", "--source-volume", vid)
    sid = snap["snapshot_id"]
    assert run("csi", "controller", "get-snapshot", sid)[0]["snapshot_id"] == sid
    listed_snaps = run("csi", "controller", "list-snapshots", "--source-volume-id", vid)
    assert [s["snapshot_id"] for s in listed_snaps] == [sid]
    [clone] = run("csi", "controller", "create-volume", "v2", "--source-snapshot", sid)
    assert clone["content_source"] == {"snapshot_id": sid}
    run("csi", "controller", "delete-snapshot", sid)
    run("csi", "controller", "delete-volume", vid, clone["volume_id"])
    assert run("csi", "controller", "list-volumes") == []


def test_node_commands(mock_cli: CLI, tmp_path: Path) -> None:
    """stage, publish, stats, expand, get-info, get-capabilities, unpublish, unstage."""
    run = mock_cli.json
    [vol] = run("csi", "controller", "create-volume", "n1", "--cap", "1,block")
    vid = vol["volume_id"]
    run("csi", "controller", "publish", vid, "--node-id", "node-1", "--cap", "1,block")
    staging, target = str(tmp_path / "staging"), str(tmp_path / "pod" / "dev")
    os.mkdir(staging)
    run("csi", "node", "stage", vid, "--staging-target-path", staging, "--cap", "1,block",
        "--pub-context", "attached-to=node-1", "--vol-context", "a=b")  # fmt: skip
    run("csi", "node", "publish", vid, "--target-path", target,
        "--staging-target-path", staging, "--cap", "1,block")  # fmt: skip
    assert os.path.isfile(target)
    [stats] = run("csi", "node", "stats", f"{vid}:{target}")
    assert stats["usage"][0]["total"] == 1 << 30
    assert run("csi", "node", "expand", vid, target)["capacity_bytes"] == 1 << 30
    assert run("csi", "node", "get-info")["node_id"] == "node-1"
    assert "STAGE_UNSTAGE_VOLUME" in run("csi", "node", "get-capabilities")
    run("csi", "node", "unpublish", vid, "--target-path", target)
    assert not os.path.exists(target)
    run("csi", "node", "unstage", vid, "--staging-target-path", staging)


def test_group_commands(mock_cli: CLI) -> None:
    """get-capabilities, create-snapshot, get-snapshot and delete-snapshot of groups."""
    run = mock_cli.json
    vids = [run("csi", "controller", "create-volume", f"g{i}")[0]["volume_id"] for i in range(2)]
    assert run("csi", "group", "get-capabilities") == ["CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT"]
    group = run("csi", "group", "create-snapshot", "grp",
                "--source-volume", vids[0], "--source-volume", vids[1])  # fmt: skip
    gid = group["group_snapshot_id"]
    members = [s["snapshot_id"] for s in group["snapshots"]]
    flags = [x for m in members for x in ("--snapshot-id", m)]
    assert run("csi", "group", "get-snapshot", gid, *flags)["group_snapshot_id"] == gid
    run("csi", "group", "delete-snapshot", gid, *flags)
    code, _, err = mock_cli.run("csi", "group", "get-snapshot", gid, *flags)
    assert code == 5 and "NOT_FOUND" in err


def test_exit_code_is_the_grpc_status(mock_cli: CLI, capsys: pytest.CaptureFixture[str]) -> None:
    """Failures exit with the gRPC code and print the status message on stderr only."""
    code, out, err = mock_cli.run("csi", "controller", "get-volume", "nope")
    assert (code, out) == (5, "") and "NOT_FOUND" in err and "'nope'" in err
    code, _, err = mock_cli.run("csi", "controller", "list-volumes", "--starting-token", "x")
    assert code == 10 and "ABORTED" in err
    code, _, err = mock_cli.run("csi", "controller", "create-volume", "x", "--params", "novalue")
    assert code == exits.USAGE and "KEY=VALUE" in err
    assert main(["csi", "identity", "probe", "--endpoint", "unix:///nonexistent/x.sock",
                 "--timeout", "2s"]) == 14  # fmt: skip
    os.environ.pop("CSI_ENDPOINT", None)
    assert main(["csi", "identity", "probe"]) == exits.USAGE
    assert "CSI_ENDPOINT" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["csi", "controller", "create-volume", "x", "--cap", "9,mount"])
    assert info.value.code == exits.USAGE


def test_endpoint_from_environment_and_flags_before_the_service(
    mock_cli: CLI, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CSI_ENDPOINT is the default endpoint; flags may come before the service name."""
    monkeypatch.setenv("CSI_ENDPOINT", mock_cli.endpoint)
    assert main(["csi", "-o", "yaml", "identity", "probe"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {"ready": True}


@pytest.fixture
def recorder(capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[FakeCSIDriver, CLI]]:
    """The recording test driver and a CLI pointed at it."""
    driver = FakeCSIDriver()
    with serve_plugin(driver.plugin()) as running:
        yield driver, CLI(capsys, running.endpoint)


def test_metadata_and_user_agent_are_sent(recorder: tuple[FakeCSIDriver, CLI]) -> None:
    """--metadata reaches the driver (csc drops it) and the user agent names kubevol-csi."""
    rec, cli = recorder
    code, _, err = cli.run("csi", "identity", "plugin-info", "-m", "tenant=a,trace=1", "-m", "x=y")
    assert code == 0, err
    [seen] = rec.metadata("GetPluginInfo")
    assert (seen["tenant"], seen["trace"], seen["x"]) == ("a", "1", "y")
    assert seen["user-agent"].startswith("kubevol-csi/")


def test_secrets_are_sent_never_printed(
    recorder: tuple[FakeCSIDriver, CLI], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Secrets from X_CSI_SECRETS or --secrets-file reach the driver and no output."""
    rec, cli = recorder
    monkeypatch.setenv("X_CSI_SECRETS", "user=admin,pass=s3cr3t-env")
    code, out, err = cli.run("csi", "controller", "create-volume", "v", "-o", "yaml")
    assert code == 0 and "s3cr3t" not in out + err
    per_rpc = tmp_path / "secrets.yaml"
    per_rpc.write_text("CreateVolumeSecret:\n  token: s3cr3t-file\nDeleteVolumeSecret: {}\n")
    code, out, err = cli.run(
        "csi", "controller", "create-volume", "w", "--secrets-file", str(per_rpc)
    )
    assert code == 0 and "s3cr3t" not in out + err
    secrets = [request["secrets"] for request in rec.requests("CreateVolume")]
    assert secrets == [{"user": "admin", "pass": "s3cr3t-env"}, {"token": "s3cr3t-file"}]
    assert "s3cr3t" not in repr(load_secrets(str(per_rpc)))


def test_capability_flag_syntax() -> None:
    """--cap takes names or numbers, mount or block (or 2/1), a filesystem and flags."""
    assert parse_capability("5,1") == t.VolumeCapability.block(t.AccessMode.MULTI_NODE_MULTI_WRITER)
    assert parse_capability("SINGLE_NODE_READER_ONLY,mount,xfs,ro,noatime") == (
        t.VolumeCapability.mount(t.AccessMode.SINGLE_NODE_READER_ONLY, "xfs", ("ro", "noatime"))
    )
    for bad in ("1", "8,mount", "1,floppy", "1,block,ext4", "writer,mount"):
        with pytest.raises(ValueError):
            parse_capability(bad)


@pytest.mark.root
def test_against_the_hostpath_driver(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Against hostpath the CLI stages and publishes with real bind mounts and tears down."""
    config = HostPathConfig(state_dir=str(tmp_path / "state"), node_id="node-1")
    with HostPathDriver(config).serve() as running:
        cli = CLI(capsys, running.endpoint)
        [vol] = cli.json("csi", "controller", "create-volume", "hp", "--req-bytes", "16Mi")
        vid = vol["volume_id"]
        staging, target = tmp_path / "staging", tmp_path / "pod" / "mnt"
        staging.mkdir()
        cli.json("csi", "node", "stage", vid, "--staging-target-path", str(staging))
        cli.json("csi", "node", "publish", vid, "--target-path", str(target),
                 "--staging-target-path", str(staging), "--read-only")  # fmt: skip
        mounted = {e.mount_point: e for e in parse_mountinfo()}
        assert str(target) in mounted and "ro" in mounted[str(target)].options
        code, out, _ = cli.run("csi", "node", "stats", f"{vid}:{target}")
        assert code == 0 and "BYTES" in out and "INODES" in out
        cli.json("csi", "node", "unpublish", vid, "--target-path", str(target))
        cli.json("csi", "node", "unstage", vid, "--staging-target-path", str(staging))
        cli.json("csi", "controller", "delete-volume", vid)
    assert not any(str(tmp_path) in e.mount_point for e in parse_mountinfo())


def test_csc_names_aliases_and_flags(mock_cli: CLI) -> None:
    """csc's habits: new/ls/rm, --snapshot-src/--volume-src, -l before the service."""
    run = mock_cli.json
    [vol] = run("csi", "controller", "new", "a1")
    vid = vol["volume_id"]
    [snap] = run("csi", "controller", "create-snapshot", "s", "--volume-src", vid)
    [clone] = run("csi", "controller", "new", "a2", "--snapshot-src", snap["snapshot_id"])
    assert clone["content_source"] == {"snapshot_id": snap["snapshot_id"]}
    assert {e["volume"]["volume_id"] for e in run("csi", "-l", "debug", "controller", "ls")} == {
        vid, clone["volume_id"]
    }
    run("csi", "controller", "delete-snapshot", snap["snapshot_id"])
    run("csi", "controller", "rm", vid, clone["volume_id"])
    assert run("csi", "controller", "list") == []


def test_request_and_response_logging_redacts_secrets(mock_cli: CLI) -> None:
    """--with-request-logging / --with-response-logging log each call on stderr, secret
    values replaced."""
    done = subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", "csi", "--with-request-logging",
         "--with-response-logging", "controller", "create-volume", "logged", "-o", "json",
         "--endpoint", mock_cli.endpoint],
        env={**os.environ, "X_CSI_SECRETS": "password=hunter2"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    out, err = done.stdout, done.stderr
    assert done.returncode == 0 and json.loads(out)[0]["volume_id"]
    assert "CreateVolume: REQ 0001:" in err and 'name: "logged"' in err
    assert "CreateVolume: REP 0001:" in err
    assert "hunter2" not in err
