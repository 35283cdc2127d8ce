"""Covers kubevol.cli.metrics: ``kubevol metrics``.

``kubevol metrics``: figures as GNU du/df/blockdev give them, in every output format.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import yaml

from kubevol.cli.main import main
from kubevol.cli.metrics import WalkProgress
from kubevol.metrics import Metrics
from kubevol.metrics.walk import native_available


def _sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr}"
    return proc.stdout


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """A small directory tree with a hard link."""
    vol = tmp_path / "vol"
    (vol / "d").mkdir(parents=True)
    for i in range(20):
        (vol / "d" / f"f{i}").write_bytes(b"v" * (i * 900))
    os.link(vol / "d" / "f3", vol / "h")
    return vol


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    """A loop device over an 8 MiB image, detached at the end."""
    image = tmp_path / "dev.img"
    with open(image, "wb") as f:
        f.truncate(8 * 1024 * 1024)
    device = _sh("losetup", "-f", "--show", str(image)).strip()
    yield device
    _sh("losetup", "-d", device)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["metrics", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_fields_are_metrics_fields_with_du_figures(
    volume: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o json`` (auto on a directory = du) has the table's fields (path, provider, which
    walker ran) and the Metrics figures, du's figures."""
    code, out, err = _run(capsys, str(volume), "-o", "json")
    assert code == 0
    assert err == ""
    data = json.loads(out)
    figures = [f.name for f in attrs.fields(Metrics) if f.name not in ("abnormal", "message")]
    assert list(data) == ["path", "provider", "method", *figures]
    assert (data["path"], data["provider"]) == (str(volume), "du")
    assert data["method"] == ("walk (native)" if native_available() else "walk (python)")
    assert data["used"] == int(_sh("du", "-x", "-s", "-B1", str(volume)).split()[0])
    assert data["inodes_used"] == int(_sh("du", "-x", "-s", "--inodes", str(volume)).split()[0])
    st = os.statvfs(volume)
    assert data["capacity"] == st.f_blocks * st.f_frsize
    assert data["inodes"] == st.f_files


@pytest.mark.root
def test_statfs_provider_matches_df(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--provider statfs`` on a tmpfs reports df's size, used, avail and inode figures."""
    mnt = tmp_path / "t"
    mnt.mkdir()
    _sh("mount", "-t", "tmpfs", "-o", "size=8m,nr_inodes=2k", "tmpfs", str(mnt))
    try:
        (mnt / "f").write_bytes(b"x" * 300_000)
        code, out, _ = _run(capsys, str(mnt), "--provider", "statfs", "-o", "json")
        fields = "size,used,avail,itotal,iused,iavail"
        df = _sh("df", "-B1", f"--output={fields}", str(mnt)).splitlines()[1].split()
    finally:
        _sh("umount", str(mnt))
    data = json.loads(out)
    assert code == 0
    expected = [int(v) for v in df]
    got = [data[k] for k in ("capacity", "used", "available", "inodes", "inodes_used")]
    assert [*got, data["inodes_free"]] == expected


@pytest.mark.root
@pytest.mark.parametrize("provider", ["block", "auto"])
def test_block_device_capacity(
    loop_device: str, provider: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A loop device measured by ``block`` (or ``auto``) reports blockdev's size, no usage."""
    code, out, _ = _run(capsys, loop_device, "--provider", provider, "-o", "yaml")
    data = yaml.safe_load(out)
    assert code == 0
    assert data["capacity"] == int(_sh("blockdev", "--getsize64", loop_device)) == 8 * 1024**2
    assert data["used"] is None


def test_table_output(volume: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default table has a header and one row naming the path and the du provider,
    sizes for people; ``-o wide`` adds which walker ran."""
    code, out, _ = _run(capsys, str(volume))
    header, row = out.splitlines()
    assert code == 0
    assert header.split()[:3] == ["PATH", "PROVIDER", "USED"]
    assert row.split()[:2] == [str(volume), "du"] and row.split()[3] in ("B", "KiB", "MiB")
    code, out, _ = _run(capsys, str(volume), "-o", "wide", "--no-headers")
    assert code == 0 and out.split()[2:4] == ["walk", f"({walker_name()})"]


@pytest.mark.parametrize(
    ("make", "provider"),
    [("missing", "auto"), ("file", "du"), ("directory", "block"), ("empty", "statfs")],
)
def test_bad_input_exits_1_with_message(
    tmp_path: Path, make: str, provider: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Missing path, file for du, directory for block, empty path: exit 1, message, no figures."""
    (tmp_path / "file").write_bytes(b"abc")
    path = {"missing": tmp_path / "nope", "file": tmp_path / "file", "directory": tmp_path}.get(
        make
    )
    arg = str(path) if path is not None else ""
    code, out, err = _run(capsys, arg, "--provider", provider)
    assert code == 1
    assert out == ""
    assert err.startswith("kubevol metrics: ")
    assert (arg in err) if arg else ("no path defined" in err)


def test_progress_is_shown_on_a_terminal_after_the_delay() -> None:
    """On a real pseudo-terminal the progress appears after the delay and is cleared."""
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as stream:
        assert stream.isatty()
        with WalkProgress(stream, "/vol", delay=0.1, interval=0.05):
            time.sleep(0.4)
    chunks = []
    while True:  # until EIO: the slave side is closed and everything was read
        try:
            chunks.append(os.read(master, 65536))
        except OSError:
            break
    os.close(master)
    written = b"".join(chunks).decode()
    assert "/vol: walking..." in written
    assert written.endswith("\x1b[K")


def test_progress_is_silent_for_quick_walks_and_non_terminals() -> None:
    """Nothing is written before the delay on a terminal, nor ever to a non-terminal."""
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as stream:
        with WalkProgress(stream, "/vol", delay=5.0):
            pass
        os.set_blocking(master, False)
        with pytest.raises(BlockingIOError):
            os.read(master, 100)  # nothing was written
    os.close(master)
    buf = io.StringIO()
    with WalkProgress(buf, "/vol", delay=0.0, interval=0.01):
        time.sleep(0.1)
    assert buf.getvalue() == ""


def walker_name() -> str:
    """The walker this build of kubevol runs."""
    return "native" if native_available() else "python"


def test_python_walker_is_named_when_the_native_one_is_missing(
    volume: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the C extension (a build without a compiler) the Python walker runs, and the
    output says so."""
    monkeypatch.setattr("kubevol.metrics.walk._load_native", lambda: None)
    code, out, _ = _run(capsys, str(volume), "-o", "json")
    assert code == 0 and json.loads(out)["method"] == "walk (python)"
