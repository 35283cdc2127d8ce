"""Covers kubevol.mount.mountinfo.

The C parser decodes mountinfo's octal escapes itself, exactly as the Python parser does.

The kernel writes space, tab, newline and backslash in paths as ``\\040``, ``\\011``,
``\\012`` and ``\\134`` (``mangle_path``). ``kubevol.mount.mountinfo`` reads the line as
UTF-8 with surrogateescape and then turns every backslash followed by three octal digits
into the character of that number (``unescape``), leaving any other backslash alone. The C
parser must give the same entries, field for field, on such lines without handing them to
the Python line parser, and the comparison must be sharp enough to catch a decoder that
differs in any of these points.
"""

from __future__ import annotations

import contextlib
import os
import re
import types
from collections.abc import Callable, Iterator
from unittest import mock

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kubevol.mount import MountInfo
from kubevol.mount import mountinfo as mountinfo_module
from kubevol.mount.mountinfo import parse_mountinfo_bytes, unescape

#: Pieces of a path field: ordinary bytes, the kernel's four escapes, other well-formed
#: octal escapes (up to 0777, above a byte), malformed ones, and bytes that are not UTF-8
#: (alone, or an incomplete sequence that an escape's decoding must not complete).
_PIECES = [
    b"a", b"/", b"Z", b"0", b"7", b"8", b"9", b"-", b",", b":", b"\r", b"\t", b"\x00",
    b"\\040", b"\\011", b"\\012", b"\\134",
    b"\\000", b"\\177", b"\\200", b"\\251", b"\\303", b"\\377", b"\\400", b"\\777",
    b"\\", b"\\\\", b"\\0", b"\\04", b"\\08", b"\\9", b"\\999", b"\\1340", b"\\x41",
    b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f", b"\xc3\xa9", b"\xe2\x82\xac",
    b"\xf0\x9f\x93\x81", b"\xed\xa0\x80",
]

_field = st.lists(st.sampled_from(_PIECES), max_size=24).map(b"".join)
#: Longer than the C parser's stack buffer (512 bytes): the heap path.
_long_field = st.builds(lambda f, n: f * n, _field, st.integers(40, 120))
_path_field = st.one_of(_field, _field, _field, _long_field)
_option = st.lists(st.sampled_from([b"rw", b"ro", b"a\\040b", b"\\", b"\xff", b"x=\\134"]),
                   min_size=1, max_size=3).map(b",".join)


@st.composite
def _lines(draw: st.DrawFn) -> bytes:
    """One well-formed mountinfo line whose fields hold escapes of every kind."""
    optional = draw(st.lists(st.sampled_from([b"shared:1", b"master:2", b"x\\040y", b"\xff"]),
                             max_size=2))
    fields = [
        str(draw(st.integers(0, 10**9))).encode(),
        str(draw(st.integers(0, 10**9))).encode(),
        b"%d:%d" % (draw(st.integers(0, 4095)), draw(st.integers(0, 2**20))),
        draw(_path_field),  # root
        draw(_path_field),  # mount point
        draw(_option),
        *optional,
        b"-",
        draw(_field),  # fs type
        draw(_path_field),  # source
        draw(_option),
    ]
    return b" ".join(fields)


_tables = st.lists(_lines(), min_size=1, max_size=8).map(lambda ls: b"\n".join(ls) + b"\n")


def _differences(data: bytes) -> list[str]:
    """The fields in which the C parser's entries differ from the Python parser's (by
    value or by type), as ``"line N: field"``; empty when they agree."""
    native = parse_mountinfo_bytes(data, native=True)
    python = parse_mountinfo_bytes(data, native=False)
    if len(native) != len(python):
        return [f"{len(native)} entries against {len(python)}"]
    found = []
    for n, (ours, theirs) in enumerate(zip(native, python, strict=True), start=1):
        assert type(ours) is MountInfo
        for field in attrs.fields(MountInfo):
            a, b = getattr(ours, field.name), getattr(theirs, field.name)
            if a != b or type(a) is not type(b):
                found.append(f"line {n}: {field.name}: {a!r} != {b!r}")
    return found


@contextlib.contextmanager
def _line_parser_calls() -> Iterator[mock.MagicMock]:
    """Counts the lines the C parser hands back to the Python line parser."""
    with mock.patch.object(
        mountinfo_module, "parse_mountinfo_line", wraps=mountinfo_module.parse_mountinfo_line
    ) as spy:
        yield spy


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(data=_tables)
@example(data=b"1 0 8:1 /a\\040b /mnt/\\011\\012\\134 rw - tmpfs my\\040src rw\n")
@example(data=b"1 0 8:1 \\ \\04 rw - \\999 \\\\134\\ rw\n")
@example(data=b"1 0 8:1 \xc3\\251 \\303\\251\xff rw - t \xe2\x82\\254 rw\n")
def test_native_decoding_equals_python_field_for_field(data: bytes) -> None:
    """On lines with any escapes, well-formed or not, and any bytes, the C parser's entries
    equal the Python parser's in every field, and no line went to the Python fallback."""
    with _line_parser_calls() as fallback:
        native = parse_mountinfo_bytes(data)
    assert fallback.call_count == 0
    assert len(native) == data.count(b"\n")
    assert _differences(data) == []


def test_escaped_lines_are_parsed_natively() -> None:
    """A table full of escaped lines costs no Python line parse."""
    line = b"7 1 0:5 / /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv\\040a/mount rw - " \
           b"ext4 /dev/x\\134y rw\n"
    with _line_parser_calls() as fallback:
        entries = parse_mountinfo_bytes(line * 100, native=True)
    assert fallback.call_count == 0
    assert entries[0].mount_point == "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv a/mount"
    assert entries[0].source == "/dev/x\\y"


def test_what_is_decoded_where() -> None:
    """The decoding the comparison holds both parsers to, spelled out."""
    [e] = parse_mountinfo_bytes(
        b"1 0 8:1 /a\\04\\999\\ /\\1340\\303\\251\xc3\\251\xff rw,a\\040b x\\040y - "
        b"t\\011p s\\777\\\\040 rw,\\134\n",
        native=True,
    )
    assert e.root == "/a\\04\\999\\"  # malformed escapes and a trailing backslash stay
    assert e.mount_point == "/\\0\u00c3\u00a9\udcc3\u00a9\udcff"  # code points, not bytes
    assert e.options == ("rw", "a\\040b")  # options and optional fields are not decoded
    assert e.optional_fields == ("x\\040y",)
    assert e.fs_type == "t\tp"
    assert e.source == "s\u01ff\\ "  # up to 0777; left to right, a backslash once
    assert e.super_options == ("rw", "\\134")


def test_long_escaped_fields() -> None:
    """A field longer than the C parser's stack buffer decodes the same."""
    path = b"/" + b"x\\040\xff\\134" * 2000
    data = b"1 0 8:1 " + path + b" " + path + b" rw - tmpfs " + path + b" rw\n"
    assert _differences(data) == []
    [e] = parse_mountinfo_bytes(data, native=True)
    assert e.root == "/" + "x \udcff\\" * 2000


def _decode_as_bytes(field: str) -> str:
    """The kernel's own reading of an escape (a byte), not kubevol's (a code point)."""
    raw = os.fsencode(field)
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8) & 0xFF]), raw))


#: Decoders that differ from kubevol's in one point each.
_BROKEN_UNESCAPES: dict[str, Callable[[str], str]] = {
    "no decoding": lambda f: f,
    "escapes as bytes": _decode_as_bytes,
    "one to three digits": lambda f: re.sub(r"\\([0-7]{1,3})", lambda m: chr(int(m[1], 8)), f),
    "digits 8 and 9 too": lambda f: re.sub(
        r"\\([0-9]{3})", lambda m: chr(sum(int(d) << 3 * k for k, d in enumerate(m[1][::-1]))), f
    ),
    "decoded twice": lambda f: unescape(unescape(f)),
    "only the kernel's four": lambda f: (f.replace("\\040", " ").replace("\\011", "\t")
                                         .replace("\\012", "\n").replace("\\134", "\\")),
    "a double backslash as one": lambda f: unescape(f.replace("\\\\", "\\")),
}

#: Lines a correct decoder must get right (each broken one above fails on one of them).
_SHARP_LINES = b"".join([
    b"1 0 8:1 /a\\040b / rw - t s rw\n",
    b"1 0 8:1 / /\\303\\251\\377\\777 rw - t s rw\n",
    b"1 0 8:1 / /\\04\\0 rw - t s rw\n",
    b"1 0 8:1 / /\\999\\080 rw - t s rw\n",
    b"1 0 8:1 / /\\134040 rw - t s\\\\134 rw\n",
    b"1 0 8:1 / /\\001\\177 rw - t s rw\n",
])


@pytest.mark.parametrize("name", sorted(_BROKEN_UNESCAPES))
def test_a_broken_python_decoder_is_caught(name: str) -> None:
    """The field-for-field comparison fails when one side decodes differently: a C decoder
    wrong in the same way would fail the property test (the lines are among its examples'
    pieces)."""
    assert _differences(_SHARP_LINES) == []
    with mock.patch.object(mountinfo_module, "unescape", _BROKEN_UNESCAPES[name]):
        assert _differences(_SHARP_LINES) != []


def test_a_decoder_without_surrogateescape_is_caught() -> None:
    """Reading bytes that are not UTF-8 as Latin-1 (not as lone surrogates) is caught."""
    data = b"1 0 8:1 /\xff\\251 /\xc3\\251 rw - t \xe2\x82 rw\n"
    assert _differences(data) == []
    latin1 = types.SimpleNamespace(fsdecode=lambda b: b.decode("latin-1"), fsencode=os.fsencode)
    with mock.patch.object(mountinfo_module, "os", latin1):
        assert _differences(data) != []
