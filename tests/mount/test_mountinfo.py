"""Covers kubevol.mount.mountinfo, kubevol.mount.table and kubevol.mount.mountread.

mountinfo parsing, the searchable MountTable, and the poll-based MountTableCache.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubevol.errors import MountError, MountInfoError
from kubevol.mount import (
    MountInfo,
    MountTable,
    MountTableCache,
    parse_mountinfo,
    parse_mountinfo_text,
    search_mount_points,
)
from kubevol.mount import mountinfo as mountinfo_module
from kubevol.mount import table as table_module
from kubevol.mount.mountinfo import escape, parse_mountinfo_bytes, unescape
from kubevol.mount.mountread import MountinfoReader
from kubevol.testing.mount_rig import MountRig
from kubevol.testing.waiting import wait_until

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "mountinfo"


def test_parses_every_field() -> None:
    """Each of the eleven fields lands in its attribute, options split on commas."""
    [e] = parse_mountinfo_text(
        "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
    )
    assert e == MountInfo(
        id=36,
        parent_id=35,
        major=98,
        minor=0,
        root="/mnt1",
        mount_point="/mnt/parent",
        options=("rw", "noatime"),
        optional_fields=("master:1",),
        fs_type="ext3",
        source="/dev/root",
        super_options=("rw", "errors=continue"),
    )


@pytest.mark.parametrize("count", [0, 1, 3])
def test_any_number_of_optional_fields(count: int) -> None:
    """Zero or several optional fields before the separator are all kept."""
    fields = " ".join(f"shared:{i}" for i in range(count))
    line = f"1 0 8:1 / /a rw {fields} - ext4 /dev/sda1 rw".replace("  ", " ")
    [e] = parse_mountinfo_text(line)
    assert e.optional_fields == tuple(f"shared:{i}" for i in range(count))
    assert e.fs_type == "ext4"


def test_octal_escapes_are_decoded() -> None:
    """Octal escapes (``\\040`` ...) in paths and sources become their characters."""
    [e] = parse_mountinfo_text(
        r"5 1 0:40 /a\040b /mnt/with\040space\011tab\012nl\134bs rw - tmpfs my\040src rw"
    )
    assert e.root == "/a b"
    assert e.mount_point == "/mnt/with space\ttab\nnl\\bs"
    assert e.source == "my src"


def test_escape_round_trips() -> None:
    """escape() writes what the kernel writes; unescape() reads it back."""
    path = "/a b\tc\nd\\e"
    assert escape(path) == r"/a\040b\011c\012d\134e"
    assert unescape(escape(path)) == path


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("1 0 8:1 / /a rw ext4 /dev/sda1 rw", "separator"),
        ("1 0 8:1 / /a rw - ext4 /dev/sda1", "3 fields after"),
        ("x 0 8:1 / /a rw - ext4 /dev/sda1 rw", "not a number"),
        ("1 0 81 / /a rw - ext4 /dev/sda1 rw", "not a number"),
    ],
)
def test_malformed_line_names_number_and_content(line: str, why: str) -> None:
    """A malformed line raises MountInfoError (a ValueError) with its line number and text."""
    text = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\n" + line + "\n"
    with pytest.raises(MountInfoError) as info:
        parse_mountinfo_text(text)
    assert "line 3" in str(info.value)
    assert repr(line) in str(info.value)
    assert why in str(info.value)
    assert isinstance(info.value, ValueError)


def test_table_names_the_malformed_line_it_hits() -> None:
    """The table's partial parse still reports the right line number."""
    table = MountTable.from_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:1 / /x rw junk\n")
    with pytest.raises(MountInfoError, match="line 2"):
        table.find_mount_point("/x")


def test_lustre_reference_lines_parse() -> None:
    """The Lustre lines from the reference (huge major, multi-NID source) parse."""
    entries = {e.mount_point: e for e in parse_mountinfo(str(FIXTURES / "lustre.txt"))}
    assert entries["/x"].device == (2389, 231328)
    assert entries["/x"].source == "10.11.1.16@o2ib:/ictstr01"
    assert entries["/lustre/shared"].source == "10.0.0.10@tcp1,10.0.0.11@tcp1:/shared"
    assert entries["/lustre/shared"].super_options == ("rw", "flock", "lazystatfs")
    team_b = [e for e in entries.values() if e.source.endswith("team b")]
    assert len(team_b) == 2


@pytest.mark.parametrize("name", ["lustre.txt", "cephfs.txt", "nfs.txt"])
def test_fixture_refs_match_a_naive_search(name: str) -> None:
    """For every mount in each fixture, the table's refs equal a plain full-scan search."""
    text = (FIXTURES / name).read_text()
    entries = parse_mountinfo_text(text)
    table = MountTable.from_text(text)
    for e in entries:
        assert search_mount_points(table, e.mount_point) == naive_refs(entries, e.mount_point)


def test_missing_file_is_a_mount_error(tmp_path: Path) -> None:
    """An unreadable mountinfo file raises MountError naming it."""
    with pytest.raises(MountError, match="nope"):
        parse_mountinfo(str(tmp_path / "nope"))


def test_parses_this_process_table() -> None:
    """The live /proc/self/mountinfo parses and has the root mount."""
    assert any(e.mount_point == "/" for e in parse_mountinfo())


def naive_refs(entries: list[MountInfo], path: str) -> list[str]:
    """SearchMountPoints written the obvious way, over fully parsed entries."""
    for e in reversed(entries):
        rel = posixpath.relpath(path, e.mount_point)
        if path == e.mount_point or not (rel == ".." or rel.startswith("../")):
            root = posixpath.normpath(posixpath.join(e.root, rel))
            return [
                o.mount_point
                for o in entries
                if o.id != e.id and o.root == root and o.device == e.device
            ]
    raise AssertionError("no containing mount")


_segment = st.sampled_from(["a", "b", "a b", "c\\d", "kubelet", "r"])
_path = st.lists(_segment, min_size=0, max_size=3).map(lambda s: "/" + "/".join(s))


@st.composite
def _tables(draw: st.DrawFn) -> list[MountInfo]:
    n = draw(st.integers(min_value=1, max_value=25))
    entries = [
        MountInfo(
            id=1, parent_id=0, major=8, minor=1, root="/", mount_point="/", options=("rw",),
            optional_fields=(), fs_type="ext4", source="/dev/sda1", super_options=("rw",),
        )
    ]
    for i in range(2, n + 1):
        entries.append(
            MountInfo(
                id=i,
                parent_id=1,
                major=draw(st.sampled_from([0, 7, 8])),
                minor=draw(st.sampled_from([1, 10])),
                root=draw(_path),
                mount_point=draw(_path),
                options=(draw(st.sampled_from(["rw", "ro"])), "relatime"),
                optional_fields=tuple(draw(st.lists(st.sampled_from(["shared:1", "master:2"]),
                                                    max_size=2))),
                fs_type=draw(st.sampled_from(["ext4", "lustre", "tmpfs"])),
                source=draw(st.sampled_from(["/dev/loop1", "10.0.0.1@tcp:/fs", "/ r"])),
                super_options=("rw",),
            )
        )
    return entries


def _render(e: MountInfo) -> str:
    opt = " ".join(e.optional_fields)
    return (
        f"{e.id} {e.parent_id} {e.major}:{e.minor} {escape(e.root)} {escape(e.mount_point)} "
        f"{','.join(e.options)}{' ' + opt if opt else ''} - {e.fs_type} {escape(e.source)} "
        f"{','.join(e.super_options)}"
    )


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(entries=_tables(), path=_path)
def test_table_search_equals_full_parse(entries: list[MountInfo], path: str) -> None:
    """On any table, the substring-search lookups give exactly the full-parse answers."""
    text = "\n".join(_render(e) for e in entries) + "\n"
    assert parse_mountinfo_text(text) == entries
    for native in (True, False):
        with _native_scans(native):
            table = MountTable.from_text(text)
            assert search_mount_points(table, path) == naive_refs(entries, path)
            exact = [e for e in entries if e.mount_point == path]
            assert table.find_mount_point(path) == (exact[-1] if exact else None)
            prefix = path.rstrip("/") + "/"
            assert table.mounted_under(path) == [
                e for e in entries if e.mount_point == path or e.mount_point.startswith(prefix)
            ]
            assert table.find_containing_all([path, "/"]) == [
                table.find_containing(path), table.find_containing("/")
            ]
            for dev in {(e.major, e.minor) for e in entries}:
                assert table.with_device(*dev) == [e for e in entries if e.device == dev]
                for root in {e.root for e in entries}:
                    same = [e for e in entries if e.device == dev and e.root == root]
                    assert table.with_device(*dev, root) == same
                    under = [
                        e for e in entries
                        if e.device == dev
                        and (e.root == root or e.root.startswith(root.rstrip("/") + "/"))
                    ]
                    assert table.with_device(*dev, root, under=True) == under


@contextlib.contextmanager
def _native_scans(native: bool) -> Iterator[None]:
    """The table's C scans, or (``native=False``) their pure-Python twins."""
    if native:
        assert table_module._native_containing is not None
        yield
        return
    with (
        mock.patch.object(table_module, "_native_containing", None),
        mock.patch.object(table_module, "_native_lines_with", None),
    ):
        yield


@pytest.mark.root
def test_cache_rereads_proc_table_only_after_a_change(rig: MountRig) -> None:
    """/proc/self/mountinfo is read once while unchanged; a new mount triggers one re-read."""
    with MountTableCache() as cache:
        first = cache.table()
        for _ in range(10):
            assert cache.table() is first
        assert cache.reads == 1
        target = rig.tmpfs(rig.base / "fresh")
        changed = cache.table()
        assert changed is not first
        assert changed.find_mount_point(str(target)) is not None
        assert cache.reads == 2
        assert cache.table() is changed


def test_cache_rereads_a_regular_file_when_it_changes(tmp_path: Path) -> None:
    """A fixture file is re-read when it is rewritten or replaced, not otherwise."""
    path = tmp_path / "mountinfo"
    path.write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")
    with MountTableCache(str(path)) as cache:
        assert cache.table().find_mount_point("/x") is None
        assert cache.table() is cache.table()
        assert cache.reads == 1
        new = tmp_path / "new"
        new.write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:1 / /x rw - ext4 /dev/sda1 rw\n")
        os.replace(new, path)
        assert cache.table().find_mount_point("/x") is not None
        assert cache.reads == 2


class _CountingLock:
    """A lock that counts the threads waiting for it or holding it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entered = 0

    def __enter__(self) -> None:
        self.entered += 1  # before blocking: the caller has already taken its ticket
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_callers_that_wait_during_a_read_share_the_next_one(tmp_path: Path) -> None:
    """A table that changes during every read (a busy node's) is read once for all the
    callers that asked while a read was under way, not once each."""
    path = tmp_path / "mountinfo"
    line = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
    path.write_text(line)
    first_read = threading.Event()
    release = threading.Event()
    real_read = MountinfoReader.read
    calls = 0

    def read(self: MountinfoReader) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            first_read.set()
            release.wait(10)
        # The table changes while it is read, as a proc table does under churn.
        path.write_text(line * (calls + 1))
        return real_read(self)

    with MountTableCache(str(path)) as cache, mock.patch.object(MountinfoReader, "read", read):
        lock = _CountingLock()
        cache._lock = lock  # type: ignore[assignment]
        results: dict[str, MountTable] = {}

        def ask(name: str) -> None:
            results[name] = cache.table()

        threads = [threading.Thread(target=ask, args=(n,)) for n in "abcd"]
        threads[0].start()
        assert first_read.wait(10)
        for t in threads[1:]:
            t.start()
        wait_until(lambda: lock.entered == 4, what="three callers waiting on the read")
        release.set()
        for t in threads:
            t.join(10)
        assert cache.reads == 2
        assert results["b"] is results["c"] is results["d"]
        assert results["b"] is not results["a"]
        # The next caller asked after both reads: the table changed since, so it reads.
        assert cache.table() is not results["b"]
        assert cache.reads == 3


def test_table_falls_back_to_a_full_scan_for_hand_written_text() -> None:
    """Options not starting with rw/ro (not kernel output) still find the containing mount."""
    table = MountTable.from_text(
        "1 0 8:1 / / defaults - ext4 /dev/sda1 rw\n2 1 7:1 / /mnt defaults - ext4 /dev/loop1 rw\n"
        "3 1 7:1 / /other defaults - ext4 /dev/loop1 rw\n"
    )
    entry = table.find_containing("/mnt/x")
    assert entry is not None
    assert entry.id == 2
    assert search_mount_points(table, "/mnt") == ["/other"]


def test_dropped_cache_does_not_leak_its_descriptor() -> None:
    """A cache dropped without close() releases its mountinfo descriptor; close is idempotent."""
    import gc

    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        MountTableCache().table()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    cache = MountTableCache()
    cache.table()
    cache.close()
    cache.close()
    assert cache.table().find_mount_point("/") is not None
    cache.close()


_line_bytes = st.one_of(
    # Kernel-shaped lines...
    _tables().map(lambda entries: "\n".join(_render(e) for e in entries).encode()),
    # ...and anything made of the characters that matter to a parser.
    st.lists(
        st.sampled_from(
            [b"1", b"22", b"8:1", b":", b" ", b"-", b"/a", b"rw,ro", b",", b"\\040", b"\\",
             b"\r", b"\n", b"+3", b"\xff", b"\xc3\xa9", b"shared:1", b"\x00", b"0" * 20]
        ),
        max_size=40,
    ).map(b"".join),
)


def _outcome(data: bytes, *, native: bool) -> object:
    try:
        return parse_mountinfo_bytes(data, native=native)
    except MountInfoError as exc:
        return ("error", str(exc))


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(data=_line_bytes)
def test_native_parser_equals_the_python_one(data: bytes) -> None:
    """The C parser gives the pure-Python parser's entries, or its error, on any text."""
    assert _outcome(data, native=True) == _outcome(data, native=False)


def test_native_parser_is_built() -> None:
    """The C parser is installed (make test builds it), so the equivalence test compares
    two implementations rather than one with itself."""
    assert mountinfo_module._native_parse is not None
