"""Covers kubevol.csidriver.server.config.

gocsi's environment as its documentation describes it: X_CSI_REQUIRE_* switches request
validation on, older names and CSI_MODE are read, X_CSI_LOG_LEVEL works, a relative
CSI_ENDPOINT is a path in the working directory, X_CSI_PLUGIN_INFO is CSV, and
``kubevol driver serve --help`` lists every variable with its default."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kubevol
from kubevol.csi.client import CSIClient
from kubevol.csidriver.server import (
    ServerConfig,
    ServerConfigError,
    parse_plugin_info,
    serve_in_background,
)
from kubevol.csidriver.server.config import ENVIRONMENT, Mode
from tests.csi.support import make_plugin

REQUIRES = [
    "X_CSI_REQUIRE_STAGING_TARGET_PATH",
    "X_CSI_REQUIRE_VOL_CONTEXT",
    "X_CSI_REQUIRE_PUB_CONTEXT",
    "X_CSI_REQUIRE_NODE_ID",
    "X_CSI_REQUIRE_CREDS",
    "X_CSI_REQUIRE_CREDS_CREATE_VOL",
    "X_CSI_REQUIRE_CREDS_NODE_PUB_VOL",
    "X_CSI_REQUIRE_VOL_ATTRIBS",
    "X_CSI_REQUIRE_PUB_VOL_INFO",
]


@pytest.mark.parametrize("variable", REQUIRES)
def test_every_require_switches_request_validation_on(variable: str) -> None:
    """Each X_CSI_REQUIRE_* (older names included) turns request validation on by itself,
    and nothing else does without being asked."""
    assert ServerConfig.from_env({variable: "true"}).req_validation
    assert not ServerConfig.from_env({}).req_validation
    assert not ServerConfig.from_env({variable: "false"}).req_validation


def test_older_names_mean_the_new_ones() -> None:
    """X_CSI_REQUIRE_VOL_ATTRIBS is _VOL_CONTEXT, _PUB_VOL_INFO is _PUB_CONTEXT, and
    X_CSI_REQUIRE_NODE_ID is read."""
    old = ServerConfig.from_env(
        {
            "X_CSI_REQUIRE_VOL_ATTRIBS": "1",
            "X_CSI_REQUIRE_PUB_VOL_INFO": "true",
            "X_CSI_REQUIRE_NODE_ID": "t",
        }
    )
    assert old.require_vol_context and old.require_pub_context and old.require_node_id
    with pytest.raises(ServerConfigError, match="X_CSI_REQUIRE_VOL_CONTEXT"):
        ServerConfig.from_env({"X_CSI_REQUIRE_VOL_ATTRIBS": "maybe"})


def test_csi_mode_as_the_readme_spells_it() -> None:
    """CSI_MODE selects the mode when X_CSI_MODE is unset; X_CSI_MODE wins."""
    assert ServerConfig.from_env({"CSI_MODE": "node"}).mode is Mode.NODE
    both = {"CSI_MODE": "node", "X_CSI_MODE": "controller"}
    assert ServerConfig.from_env(both).mode is Mode.CONTROLLER


@pytest.mark.parametrize(
    ("word", "level"),
    [
        ("", None),
        ("PANIC", logging.CRITICAL),
        ("fatal", logging.CRITICAL),
        ("ERROR", logging.ERROR),
        ("warn", logging.WARNING),
        ("INFO", logging.INFO),
        ("debug", logging.DEBUG),
    ],
)
def test_log_level_words(word: str, level: int | None) -> None:
    """X_CSI_LOG_LEVEL takes logrus's words in any case; unset, it asks for nothing (the
    level already configured, or INFO, applies)."""
    assert ServerConfig.from_env({"X_CSI_LOG_LEVEL": word}).log_level == level


def test_debug_means_debug_level_and_bad_level_is_refused() -> None:
    """X_CSI_DEBUG is X_CSI_LOG_LEVEL=DEBUG plus logging; an unknown word names the
    variable."""
    config = ServerConfig.from_env({"X_CSI_DEBUG": "true", "X_CSI_LOG_LEVEL": "ERROR"})
    assert config.log_level == logging.DEBUG and config.req_logging and config.rep_logging
    with pytest.raises(ServerConfigError, match="X_CSI_LOG_LEVEL"):
        ServerConfig.from_env({"X_CSI_LOG_LEVEL": "chatty"})


def test_plugin_info_is_csv() -> None:
    """Quoted fields keep their spaces and commas; unquoted ones are trimmed."""
    info = parse_plugin_info('x.example.com , 1.0, "note=a, b", " pad = v ", k = v2')
    assert info is not None
    assert (info.name, info.vendor_version) == ("x.example.com", "1.0")
    assert info.manifest == {"note": "a, b", " pad ": " v ", "k": "v2"}
    escaped = parse_plugin_info('x.example.com, 1.0, "say=""hi"""')
    assert escaped is not None and escaped.manifest == {"say": '"hi"'}
    for bad in ('x.example.com, 1.0, "open', 'x.example.com, 1.0, a"b=c'):
        with pytest.raises(ServerConfigError, match="X_CSI_PLUGIN_INFO"):
            parse_plugin_info(bad)


def test_relative_endpoint_is_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CSI_ENDPOINT=csi.sock (gocsi's README example) serves on ./csi.sock."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    plugin, _ = make_plugin()
    handle = serve_in_background(plugin, env={"CSI_ENDPOINT": "csi.sock"})
    try:
        assert handle.address == f"unix://{work / 'csi.sock'}"
        with CSIClient(handle.address, timeout=10) as client:
            assert client.probe()
    finally:
        handle.stop(grace=1)


def test_serve_help_lists_every_variable_with_its_default() -> None:
    """``kubevol driver serve --help`` names every variable of ENVIRONMENT with a default,
    and ENVIRONMENT names every X_CSI_* variable kubevol's server code reads."""
    proc = subprocess.run(
        [sys.executable, "-m", "kubevol.cli.main", "driver", "serve", "--help"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for var in ENVIRONMENT:
        assert f"{var.name}  (default: {var.default})" in proc.stdout, var.name
    documented = " ".join(f"{v.name} {v.help}" for v in ENVIRONMENT)
    package = Path(kubevol.__file__).parent / "csi"
    read: set[str] = set()
    for sub in ("server", "locks"):
        for source in (package / sub).rglob("*.py"):
            read |= set(re.findall(r'"((?:X_)?CSI_[A-Z_]+)"', source.read_text()))
    missing = {
        name
        for name in read
        if name not in documented and name.rstrip("_") not in documented
    }
    assert not missing, f"read but not in ENVIRONMENT: {sorted(missing)}"


@pytest.mark.slow
def test_log_level_applies_to_a_served_driver(tmp_path: Path) -> None:
    """``kubevol driver serve`` logs its start at INFO by default (as gocsi's INFO default
    does); with X_CSI_LOG_LEVEL=WARN it does not."""
    outputs = []
    for level in ("", "WARN"):
        sock = tmp_path / f"{level or 'default'}.sock"
        env = {**os.environ, "X_CSI_LOG_LEVEL": level, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "kubevol.cli.main", "driver", "serve", "mock",
             "--endpoint", f"unix://{sock}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not sock.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sock.exists()
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        outputs.append(err)
    assert " serving " in outputs[0]
    assert " serving " not in outputs[1]
