"""Covers kubevol.cli.logs.

One logging scheme for every command: ``-v`` and ``--log-format`` before the command,
each message printed once."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kubevol.cli.logs import setup_logging, verbosity_level
from kubevol.cli.main import chosen_command, main


def test_verbosity_follows_klog() -> None:
    """0 shows warnings, 1-3 information, 4 and more debug."""
    assert verbosity_level(0) == logging.WARNING
    assert verbosity_level(2) == logging.INFO
    assert verbosity_level(4) == logging.DEBUG


def test_global_flags_do_not_hide_the_command() -> None:
    """The value of -v or --log-format is not taken for the command word."""
    assert chosen_command(["-v", "2", "plugins"]) == "plugins"
    assert chosen_command(["--log-format", "json", "-v", "4", "status", "x"]) == "status"


def test_an_unavailable_driver_is_reported_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CSI driver given that cannot be reached is one line (the command's error, saying
    what to do), not a warning and an error; and it is not remembered."""
    root = tmp_path / "root"
    (root / "pods").mkdir(parents=True)
    code = main(["status", "--root", str(root), "--no-metrics",
                 "--csi-driver", f"x.example.com=unix://{tmp_path}/absent.sock"])
    assert code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "x.example.com" in line]
    assert len(lines) == 1, err
    assert "does not answer" in lines[0] and "start the driver" in lines[0]
    assert not (root / "kubevol" / "csi-drivers.json").exists()


def test_json_log_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--log-format json: every log line is one JSON object with klog's ts, v and msg."""
    state = tmp_path / "root" / "kubevol"
    state.mkdir(parents=True)
    (state / "csi-drivers.json").write_text(
        json.dumps({"x.example.com": f"unix://{tmp_path}/absent.sock"}))
    main(["--log-format", "json", "status", "--root", str(tmp_path / "root"), "--no-metrics"])
    logged = [json.loads(line) for line in capsys.readouterr().err.splitlines()
              if line.startswith("{")]
    assert logged, "no JSON log line"
    entry = next(e for e in logged if "x.example.com" in e["msg"])
    assert entry["level"] == "warning" and entry["v"] == 0 and entry["ts"] > 0


def test_setup_twice_prints_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Setting logging up again replaces the handler instead of adding a second one."""
    setup_logging(1, "text")
    setup_logging(1, "text")
    logging.getLogger("kubevol.test").info("hello")
    assert capsys.readouterr().err.count("hello") == 1
