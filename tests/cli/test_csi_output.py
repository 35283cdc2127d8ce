"""Covers kubevol.cli.csi with kubevol.cli.output: ``kubevol csi``'s output formats.

``kubevol csi`` output formats against the bundled mock driver over a real socket: enums
by name in every format, as protobuf's JSON mapping writes them
(``google.protobuf.json_format``), ``-o name`` one line per object, and the group snapshot
commands sending the member ids the CSI spec requires."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format

from kubevol.cli import exits
from kubevol.cli.main import main
from kubevol.csi import pb
from kubevol.csidriver.drivers.mock import MockConfig, MockDriver
from tests.cli.test_csi_cli import CLI


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Iterator[CLI]:
    """The CLI pointed at a served mock driver (groups supported)."""
    with MockDriver(MockConfig(node_id="node-1")).serve() as running:
        yield CLI(capsys, running.endpoint)


def _ok(cli: CLI, *args: str) -> str:
    code, out, err = cli.run(*args)
    assert code == 0, err
    return out


def _proto_json(message: Any) -> Any:
    """What protobuf's JSON mapping writes for ``message`` (field names as in the proto)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _block_volume(cli: CLI, tmp_path: Path) -> tuple[str, str]:
    """A block volume staged and published by the CLI: (volume id, target path)."""
    [vol] = cli.json("csi", "controller", "create-volume", "b1", "--cap", "1,block")
    vid = vol["volume_id"]
    cli.json("csi", "controller", "publish", vid, "--node-id", "node-1", "--cap", "1,block")
    staging, target = str(tmp_path / "staging"), str(tmp_path / "pod" / "dev")
    os.mkdir(staging)
    cli.json("csi", "node", "stage", vid, "--staging-target-path", staging, "--cap", "1,block",
             "--pub-context", "attached-to=node-1")  # fmt: skip
    cli.json("csi", "node", "publish", vid, "--target-path", target,
             "--staging-target-path", staging, "--cap", "1,block")  # fmt: skip
    return vid, target


def test_node_stats_writes_the_usage_unit_by_name_in_every_format(
    cli: CLI, tmp_path: Path
) -> None:
    """node stats -o yaml works (it crashed on the enum, exit 70) and yaml, json, jsonpath
    and the table all write the unit as protobuf's JSON mapping does: BYTES."""
    vid, target = _block_volume(cli, tmp_path)
    expected = _proto_json(pb.VolumeUsage(unit=pb.VolumeUsage.BYTES))["unit"]
    assert expected == "BYTES"
    spec = f"{vid}:{target}"
    [from_yaml] = yaml.safe_load(_ok(cli, "csi", "node", "stats", spec, "-o", "yaml"))
    [from_json] = json.loads(_ok(cli, "csi", "node", "stats", spec, "-o", "json"))
    assert from_yaml == from_json
    assert [u["unit"] for u in from_json["usage"]] == [expected]
    assert from_json["usage"][0]["total"] == 1 << 30
    path = _ok(cli, "csi", "node", "stats", spec, "-o", "jsonpath={[*].usage[*].unit}")
    assert path == f"{expected}\n"
    header, row = _ok(cli, "csi", "node", "stats", spec).splitlines()
    assert header.split()[4:6] == ["UNIT", "TOTAL"]
    assert row.split()[2:4] == [expected, "1.0"]  # and bytes shown as sizes: 1.0 GiB


def test_validate_volume_capabilities_writes_access_modes_by_name(
    cli: CLI, tmp_path: Path
) -> None:
    """validate-volume-capabilities -o yaml works (it crashed, exit 70) and json and yaml
    name the confirmed access mode as protobuf's JSON mapping does."""
    vid, _ = _block_volume(cli, tmp_path)
    mode = pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)
    expected = _proto_json(mode)["mode"]
    args = ("csi", "controller", "validate-volume-capabilities", vid, "--cap", "1,block")
    from_yaml = yaml.safe_load(_ok(cli, *args, "-o", "yaml"))
    from_json = json.loads(_ok(cli, *args, "-o", "json"))
    assert from_yaml == from_json
    [cap] = from_json["confirmed"]["volume_capabilities"]
    assert cap["access_mode"] == expected == "SINGLE_NODE_WRITER"


def test_group_snapshot_name_is_printed_once(cli: CLI) -> None:
    """create-snapshot and get-snapshot of a group of two print its id once with -o name,
    while the table keeps one row per member snapshot."""
    vids = [cli.json("csi", "controller", "create-volume", f"g{i}")[0]["volume_id"]
            for i in range(2)]  # fmt: skip
    sources = [x for v in vids for x in ("--source-volume", v)]
    out = _ok(cli, "csi", "group", "create-snapshot", "grp", *sources, "-o", "name")
    [gid] = out.splitlines()
    members = [s["snapshot_id"] for s in cli.json("csi", "controller", "list-snapshots")
               if s["source_volume_id"] in vids]  # fmt: skip
    assert len(members) == 2
    flags = [x for m in members for x in ("--snapshot-id", m)]
    assert _ok(cli, "csi", "group", "get-snapshot", gid, *flags, "-o", "name") == f"{gid}\n"
    table = _ok(cli, "csi", "group", "get-snapshot", gid, *flags).splitlines()
    assert [row.split()[0] for row in table] == ["GROUP", gid, gid]


@pytest.mark.parametrize("verb", ["get-snapshot", "delete-snapshot"])
def test_group_commands_require_the_member_ids(
    cli: CLI, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    """GetVolumeGroupSnapshot and DeleteVolumeGroupSnapshot require snapshot_ids (csi.proto):
    without --snapshot-id the command is a usage error and nothing is sent."""
    with pytest.raises(SystemExit) as info:
        main(["csi", "group", verb, "group-1", "--endpoint", cli.endpoint])
    assert info.value.code == exits.USAGE
    assert "the following arguments are required: --snapshot-id" in capsys.readouterr().err


def test_group_member_ids_reach_the_driver(cli: CLI) -> None:
    """The ids given are sent: the mock driver refuses ids that are not the group's
    members (FAILED_PRECONDITION, exit 9), which it can only do if it received them."""
    [vol] = cli.json("csi", "controller", "create-volume", "m")
    group = cli.json("csi", "group", "create-snapshot", "grp", "--source-volume",
                     vol["volume_id"])  # fmt: skip
    gid = group["group_snapshot_id"]
    code, _, err = cli.run("csi", "group", "get-snapshot", gid, "--snapshot-id", "other")
    assert code == 9 and "snapshot_ids do not match" in err
    [member] = group["snapshots"]
    got = cli.json("csi", "group", "get-snapshot", gid, "--snapshot-id", member["snapshot_id"])
    assert got["group_snapshot_id"] == gid
