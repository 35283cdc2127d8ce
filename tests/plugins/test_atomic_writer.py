"""Covers kubevol.plugins.atomic_writer.

The atomic writer: the kubelet's on-disk layout, updates, validation, modes, and readers
that never see a mix of two versions."""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubevol.errors import InvalidPayloadPathError, SpecError
from kubevol.plugins.atomic_writer import (
    DATA_DIR_NAME,
    NEW_DATA_DIR_NAME,
    AtomicWriter,
    FileProjection,
    validate_payload_path,
)

TS_DIR = re.compile(r"^\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.\d{1,10}$")


def files(**contents: str) -> dict[str, FileProjection]:
    return {k.replace("__", "/"): FileProjection(data=v.encode()) for k, v in contents.items()}


def ts_dirs(target: Path) -> list[str]:
    return sorted(n for n in os.listdir(target) if TS_DIR.match(n))


def test_layout_matches_the_kubelet(tmp_path: Path) -> None:
    """A timestamped data dir, ``..data`` pointing at it, one link per top-level name."""
    AtomicWriter(str(tmp_path)).write(files(a="1", sub__b="2", sub__deep__c="3"))
    (ts,) = ts_dirs(tmp_path)
    assert os.readlink(tmp_path / DATA_DIR_NAME) == ts
    assert os.readlink(tmp_path / "a") == "..data/a"
    assert os.readlink(tmp_path / "sub") == "..data/sub"
    assert sorted(os.listdir(tmp_path)) == sorted([ts, DATA_DIR_NAME, "a", "sub"])
    assert (tmp_path / "sub" / "deep" / "c").read_text() == "3"
    assert stat.S_IMODE((tmp_path / ts).stat().st_mode) == 0o755
    assert stat.S_ISREG((tmp_path / ts / "a").lstat().st_mode)


def test_modes_are_exact_whatever_the_umask(tmp_path: Path) -> None:
    """defaultMode 0644, per-item modes, applied exactly even under umask 077."""
    payload = {
        "default": FileProjection(data=b"x"),
        "private": FileProjection(data=b"y", mode=0o400),
        "open": FileProjection(data=b"z", mode=0o666),
    }
    old = os.umask(0o077)
    try:
        AtomicWriter(str(tmp_path)).write(payload)
    finally:
        os.umask(old)
    data = tmp_path / DATA_DIR_NAME
    assert stat.S_IMODE((data / "default").stat().st_mode) == 0o644
    assert stat.S_IMODE((data / "private").stat().st_mode) == 0o400
    assert stat.S_IMODE((data / "open").stat().st_mode) == 0o666


@pytest.mark.root
def test_fs_user_owns_the_file(tmp_path: Path) -> None:
    """A projection with ``fs_user`` is chowned to it (the group stays)."""
    AtomicWriter(str(tmp_path)).write({"t": FileProjection(data=b"x", fs_user=4321)})
    st_ = (tmp_path / "t").stat()
    assert st_.st_uid == 4321
    assert st_.st_gid == os.getgid()


def test_update_adds_changes_and_removes_keys(tmp_path: Path) -> None:
    """A new data dir replaces the old one; links of names gone are removed, new ones made."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(keep="1", change="old", gone="x", olddir__f="y"))
    (first,) = ts_dirs(tmp_path)
    assert writer.write(files(keep="1", change="new", added="a"))
    (second,) = ts_dirs(tmp_path)
    assert second != first
    assert os.readlink(tmp_path / DATA_DIR_NAME) == second
    assert (tmp_path / "change").read_text() == "new"
    assert (tmp_path / "added").read_text() == "a"
    assert not os.path.lexists(tmp_path / "gone")
    assert not os.path.lexists(tmp_path / "olddir")
    expected = [second, DATA_DIR_NAME, "keep", "change", "added"]
    assert sorted(os.listdir(tmp_path)) == sorted(expected)


def test_removing_a_key_alone_rewrites(tmp_path: Path) -> None:
    """A payload that only lost a key is still a change."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(a="1", b="2"))
    assert writer.write(files(a="1"))
    assert not os.path.lexists(tmp_path / "b")


def test_unchanged_payload_rewrites_nothing(tmp_path: Path) -> None:
    """Same data: no new data dir, files untouched."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(a="1", d__b="2"))
    (ts,) = ts_dirs(tmp_path)
    before = (tmp_path / ts / "a").stat().st_mtime_ns
    assert writer.write(files(a="1", d__b="2")) is False
    assert ts_dirs(tmp_path) == [ts]
    assert (tmp_path / ts / "a").stat().st_mtime_ns == before


def test_unchanged_payload_restores_a_missing_link(tmp_path: Path) -> None:
    """A user-visible link that went missing is made again without a rewrite (k8s #121472)."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(a="1"))
    os.unlink(tmp_path / "a")
    assert writer.write(files(a="1")) is False
    assert os.readlink(tmp_path / "a") == "..data/a"


def test_set_perms_runs_on_the_new_dir_before_it_is_published(tmp_path: Path) -> None:
    """The hook sees the new timestamped dir while ``..data`` still shows the old data."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(a="old"))
    seen: list[tuple[str, str]] = []

    def hook(ts_name: str) -> None:
        seen.append((ts_name, (tmp_path / "a").read_text()))

    writer.write(files(a="new"), set_perms=hook)
    ((name, visible),) = seen
    assert TS_DIR.match(name)
    assert visible == "old"
    assert os.readlink(tmp_path / DATA_DIR_NAME) == name


def test_a_failed_write_keeps_the_old_version(tmp_path: Path) -> None:
    """set_perms failing: the old data stays visible and the new dir is removed."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(a="old"))
    (ts,) = ts_dirs(tmp_path)

    def fail(_: str) -> None:
        raise PermissionError(errno.EPERM, "no")

    with pytest.raises(PermissionError):
        writer.write(files(a="new"), set_perms=fail)
    assert ts_dirs(tmp_path) == [ts]
    assert (tmp_path / "a").read_text() == "old"


def test_leftovers_of_a_killed_writer_are_cleared(tmp_path: Path) -> None:
    """A stale ``..data_tmp`` link and an unpublished data dir do not block or linger."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(a="1"))
    abandoned = tmp_path / "..2020_01_01_00_00_00.123"
    abandoned.mkdir()
    (abandoned / "a").write_text("half")
    os.symlink(abandoned.name, tmp_path / NEW_DATA_DIR_NAME)
    writer.write(files(a="2"))
    assert (tmp_path / "a").read_text() == "2"
    assert not abandoned.exists()
    assert not os.path.lexists(tmp_path / NEW_DATA_DIR_NAME)
    assert len(ts_dirs(tmp_path)) == 1


def test_target_must_exist(tmp_path: Path) -> None:
    """The writer is only made for an existing directory."""
    with pytest.raises(FileNotFoundError):
        AtomicWriter(str(tmp_path / "nope"))


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "must not be empty"),
        ("/etc/passwd", "must be a relative path"),
        ("../escape", "must not contain '..'"),
        ("a/../../b", "must not contain '..'"),
        ("..data", "must not start with '..'"),
        ("..2024_01_01", "must not start with '..'"),
        ("a" * 256, "at most 255 bytes"),
        ("a/" * 2048 + "b", "at most 4096 bytes"),
        (".", "volume directory itself"),
        ("a\0b", "NUL"),
    ],
)
def test_bad_paths_are_refused_naming_the_key(path: str, why: str) -> None:
    """Each rule of the kubelet's validatePath, with the key named in the message."""
    with pytest.raises(InvalidPayloadPathError, match=re.escape(why)) as info:
        validate_payload_path(path, key="my-key")
    assert "'my-key'" in str(info.value)
    assert isinstance(info.value, SpecError)


def test_acceptable_paths_are_cleaned() -> None:
    """``./a//b/`` is ``a/b``; a dot-prefixed name that is not ``..x`` is fine."""
    assert validate_payload_path("./a//b/") == "a/b"
    assert validate_payload_path(".hidden") == ".hidden"
    assert validate_payload_path("a/..b") == "a/..b"


_segment = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=12,
)


@st.composite
def bad_paths(draw: st.DrawFn) -> str:
    parts = draw(st.lists(_segment, min_size=1, max_size=4))
    kind = draw(st.sampled_from(["abs", "dotdot", "prefix", "long", "empty"]))
    if kind == "abs":
        return "/" + "/".join(parts)
    if kind == "dotdot":
        parts.insert(draw(st.integers(0, len(parts))), "..")
        return "/".join(parts)
    if kind == "prefix":
        return ".." + "/".join(parts)
    if kind == "long":
        return "/".join([*parts, "x" * 256])
    return ""


@settings(max_examples=200, deadline=None)
@given(bad=bad_paths())
def test_a_bad_path_anywhere_writes_nothing(tmp_path_factory: pytest.TempPathFactory,
                                             bad: str) -> None:
    """Any payload holding one bad path is refused whole: the directory is left as it was."""
    target = tmp_path_factory.mktemp("aw")
    writer = AtomicWriter(str(target))
    writer.write(files(a="1"))
    before = sorted(os.listdir(target))
    payload = {**files(a="2", b="3"), bad: FileProjection(data=b"evil")}
    with pytest.raises(InvalidPayloadPathError):
        writer.write(payload)
    assert sorted(os.listdir(target)) == before
    assert (target / "a").read_text() == "1"


def _read_snapshot(target: Path) -> tuple[str, str] | None:
    """Both files of one version, read through one open of ``..data``; None when the
    version was retired (its dir removed) while reading."""
    try:
        dir_fd = os.open(target / DATA_DIR_NAME, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        out = []
        for name in ("a", "b"):
            fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
            try:
                out.append(os.read(fd, 1 << 16).decode())
            finally:
                os.close(fd)
        return out[0], out[1]
    except FileNotFoundError:
        return None
    finally:
        os.close(dir_fd)


@pytest.mark.slow
def test_concurrent_reader_never_sees_a_mix(tmp_path: Path) -> None:
    """While versions are written in a loop, readers see whole versions: a file never
    empty or torn, and the files of one ``..data`` always from the same version."""
    writer = AtomicWriter(str(tmp_path))
    writer.write(files(a="v0" * 1000, b="v0"))
    stop = threading.Event()
    problems: list[str] = []
    seen_versions: set[str] = set()

    def reader() -> None:
        while not stop.is_set():
            snap = _read_snapshot(tmp_path)
            if snap is not None:
                a, b = snap
                if a != b * 1000:
                    problems.append(f"mixed: {a[:8]} / {b}")
                seen_versions.add(b)
            try:
                single = (tmp_path / "a").read_text()
            except FileNotFoundError:
                continue  # the link resolved to a dir retired meanwhile: retry
            if len(single) != 2000 or single != single[:2] * 1000:
                problems.append(f"torn read of a: {single[:12]}")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for n in range(1, 200):
            version = f"v{n % 10}"
            writer.write(files(a=version * 1000, b=version))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert problems == []
    assert len(seen_versions) > 1


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "deep").mkdir(parents=True)
    (victim / "deep" / "precious").write_text("keep me")
    return victim


@pytest.mark.parametrize("how", ["absolute", "dotdot", "ts-name-as-link"])
def test_a_data_link_pointing_out_of_the_volume_deletes_nothing(tmp_path: Path, how: str) -> None:
    """``..data`` replaced by a link to another directory (absolute, ``../``, or a
    timestamped name that is itself a link) is ignored: the next write publishes a new
    version and the directory it pointed at keeps every file (it used to be removed)."""
    target = tmp_path / "vol"
    target.mkdir()
    victim = _victim(tmp_path)
    writer = AtomicWriter(str(target))
    writer.write(files(a="1"))
    data = target / DATA_DIR_NAME
    data.unlink()
    if how == "absolute":
        data.symlink_to(victim)
    elif how == "dotdot":
        data.symlink_to("../victim")
    else:
        fake = "..2020_01_01_00_00_00.1"
        (target / fake).symlink_to(victim)
        data.symlink_to(fake)
    assert writer.write(files(a="2")) is True
    assert (victim / "deep" / "precious").read_text() == "keep me"
    assert (target / "a").read_text() == "2"
    assert TS_DIR.match(os.readlink(data))
