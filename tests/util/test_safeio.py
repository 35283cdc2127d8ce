"""kubevol.util.safeio: metadata files that are FIFOs, links to /dev/zero, huge or nested
100,000 deep are refused quickly with one UntrustedDataError (issue 20, point 5)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubevol.errors import UntrustedDataError
from kubevol.util.safeio import (
    MAX_JSON_DEPTH,
    json_depth_exceeds,
    load_json_file,
    parse_json,
    read_regular_file,
)


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A read that blocks fails the test after 10 s instead of hanging the suite."""

    def fail(signum: int, frame: object) -> None:
        raise TimeoutError("the read blocked")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    """The usual case, including a file exactly at the cap and an empty one."""
    (tmp_path / "f").write_bytes(b"x" * 1000)
    assert read_regular_file(str(tmp_path / "f"), max_bytes=1000) == b"x" * 1000
    (tmp_path / "e").write_bytes(b"")
    assert read_regular_file(str(tmp_path / "e")) == b""


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO with no writer: an ordinary open would block forever."""
    os.mkfifo(tmp_path / "vol_data.json")
    with pytest.raises(UntrustedDataError, match="FIFO"):
        load_json_file(str(tmp_path / "vol_data.json"))


def test_a_link_to_dev_zero_is_refused(tmp_path: Path) -> None:
    """A read through it would never end."""
    (tmp_path / "vol_data.json").symlink_to("/dev/zero")
    with pytest.raises(UntrustedDataError, match="symbolic link"):
        load_json_file(str(tmp_path / "vol_data.json"))


def test_a_directory_is_refused(tmp_path: Path) -> None:
    """Named as what it is."""
    (tmp_path / "vol_data.json").mkdir()
    with pytest.raises(UntrustedDataError, match="a directory"):
        read_regular_file(str(tmp_path / "vol_data.json"))


def test_a_file_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    """A sparse 10 GiB file is refused from its size, without reading it."""
    with open(tmp_path / "big", "wb") as f:
        f.truncate(10 * 1024**3)
    with pytest.raises(UntrustedDataError, match="more than"):
        read_regular_file(str(tmp_path / "big"))


def test_a_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    """Callers tell "missing" apart from "bad"."""
    with pytest.raises(FileNotFoundError):
        load_json_file(str(tmp_path / "nothing"))


def test_deep_json_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    """100,000 levels: one UntrustedDataError, not RecursionError."""
    path = tmp_path / "vol_data.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(UntrustedDataError, match="deeper"):
        load_json_file(str(path))
    path.write_bytes(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    with pytest.raises(UntrustedDataError, match="deeper"):
        load_json_file(str(path))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    """A value full of brackets (and escaped quotes) is still a flat document."""
    doc = {"cmd": "[" * 500 + '\\"{' * 300, "n": [[1]]}
    data = json.dumps(doc).encode()
    assert not json_depth_exceeds(data, MAX_JSON_DEPTH)
    assert parse_json(data, "doc") == doc
    assert json_depth_exceeds(b"[" * 101 + b"]" * 101, 100)
    assert not json_depth_exceeds(b"[" * 100 + b"]" * 100, 100)


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"driverName": "x"', b"\xff\xfe\x00garbage", b"null", b"[1, 2"],
)
def test_malformed_json_is_one_untrusted_data_error(tmp_path: Path, content: bytes) -> None:
    """Truncated, empty, binary: refused naming the file (``null`` parses: callers check types)."""
    path = tmp_path / "vol_data.json"
    path.write_bytes(content)
    if content == b"null":
        assert load_json_file(str(path)) is None
        return
    with pytest.raises(UntrustedDataError, match=r"vol_data\.json"):
        load_json_file(str(path))
