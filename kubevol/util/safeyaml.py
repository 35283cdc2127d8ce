"""Loading YAML manifests with the bounds the Kubernetes API server puts on them.

YAML aliases let a few hundred bytes stand for gigabytes: PyYAML loads an alias as a second
reference to the same object, cheaply, and the bill comes when anything walks the result
(a 421-byte manifest drove ``kubevol up`` to 3.9 GB). Deep nesting crashes libyaml's
recursive composer outright (a segfault, at about 100,000 levels) and the pure-Python one
with ``RecursionError``. So a manifest is loaded in steps:

1. its size is capped: a document at the API server's request body limit (3 MiB), a file
   at :data:`MAX_MANIFEST_BYTES`;
2. unless the text itself shows that it has no alias and nests shallowly (a cheap bound),
   one pass over libyaml's parse events (its parser keeps state on a heap stack and never
   expands an alias) measures each document before any composer runs: nesting at most
   :data:`MAX_YAML_DEPTH` with aliases expanded, no alias inside its own anchor, and
   alias expansion within go-yaml's rule, which the API server's YAML decoding applies:
   refused once more than 100 decodes come from aliases, more than 1,000 in all, and
   aliases make more than 99% of them (up to 400,000 decodes, falling to 10% at
   4,000,000);
3. only then is it built, with libyaml's ``CSafeLoader`` when PyYAML has it (about six
   times faster than the pure-Python ``SafeLoader``, which is the fallback).

A text whose documents are each a JSON object is read as JSON instead, as the kubelet reads
a manifest: its file source hands a text that starts with ``{`` to the JSON decoder as it is
(apimachinery's ``yaml.ToJSON``), and YAML only the others. The JSON reading differs from
YAML 1.1's on a few values (``1e5`` is a number to JSON and the kubelet, a string to
PyYAML), and it is about twenty times faster (0.5 ms a pod of four objects with libyaml).
See :func:`_json_documents`.

Every refusal, and every YAML error, is an :class:`~kubevol.errors.UntrustedDataError`
naming where the text came from.
"""

from __future__ import annotations

import functools
import json
import re
from types import ModuleType
from typing import Any

from kubevol.errors import UntrustedDataError
from kubevol.util.safeio import MAX_JSON_DEPTH, json_depth_exceeds

#: The API server's limit on a request body, hence on one object's manifest.
MAX_DOCUMENT_BYTES = 3 * 1024 * 1024
#: The largest manifest file (or text) loaded: many documents of one kind each.
MAX_MANIFEST_BYTES = 32 * 1024 * 1024
#: The deepest nesting accepted (as for JSON metadata: far beyond any real manifest).
MAX_YAML_DEPTH = MAX_JSON_DEPTH

# go-yaml's alias-expansion rule (its decode.go), as the API server's YAML decoding uses it.
_ALIAS_MIN_ALIASES = 100
_ALIAS_MIN_DECODES = 1_000
_ALIAS_RANGE_LOW = 400_000
_ALIAS_RANGE_HIGH = 4_000_000


@functools.cache
def _yaml() -> ModuleType:
    """PyYAML, imported on the first YAML text: JSON manifests and records never need it,
    and its import (with libyaml's bindings) takes about 20 ms of a command's start."""
    import yaml

    return yaml


def _loader(text: str) -> Any:
    """A loader of ``text``: libyaml's ``CSafeLoader`` when PyYAML has it, else the
    pure-Python ``SafeLoader`` (PyYAML's loaders are untyped)."""
    yaml = _yaml()
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)


#: Where block content starts on each line: indentation, then a document start, compact
#: indicators (``- - key``) and node properties, each of which may open one more level.
_DOCUMENT_MARKER = re.compile(r"^(?:---|\.\.\.)(?=[ \t\r\n]|$)", re.MULTILINE)
_BLOCK_PREFIX = re.compile(r"^[ \t]*(?:(?:---|[-?:]|[&!]\S*)[ \t]+)*", re.MULTILINE)


#: A line that is only a document start: where a text of JSON documents is cut.
_DOCUMENT_START_LINE = re.compile(r"^---[ \t]*\r?$", re.MULTILINE)
#: A surrogate escape: libyaml refuses it; json would make a string UTF-8 cannot encode.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _not_json(token: str) -> object:
    raise ValueError(f"{token} is not JSON")  # json takes NaN and Infinity; Go's does not


_JSON_DECODER = json.JSONDecoder(parse_constant=_not_json)


def _json_documents(text: str) -> list[object] | None:
    """The documents of ``text`` when each (cut at lines that are only ``---``) is one JSON
    object, within the size and depth bounds; else None, and the text is YAML's to read
    (and refuse). Blank pieces are empty documents, as in YAML, except before the first
    marker. No line of a JSON text is ``---``, so the cut is where YAML would cut."""
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        return None
    docs: list[object] = []
    for n, piece in enumerate(_DOCUMENT_START_LINE.split(text)):
        if not piece.strip():
            if n:
                docs.append(None)
            continue
        if (
            not piece.lstrip().startswith("{")
            or len(piece) > MAX_DOCUMENT_BYTES
            or json_depth_exceeds(piece.encode(), MAX_YAML_DEPTH)
        ):
            return None
        try:
            docs.append(_JSON_DECODER.decode(piece))
        except (ValueError, RecursionError):
            return None
    return docs


def allowed_alias_ratio(decodes: int) -> float:
    """The share of decodes that may come from aliases in a document of ``decodes`` decodes."""
    if decodes <= _ALIAS_RANGE_LOW:
        return 0.99
    if decodes >= _ALIAS_RANGE_HIGH:
        return 0.10
    span = _ALIAS_RANGE_HIGH - _ALIAS_RANGE_LOW
    return 0.99 - 0.89 * (decodes - _ALIAS_RANGE_LOW) / span


def _depth_upper_bound(text: str) -> int:
    """A bound on the nesting depth of ``text`` that needs no parsing: every flow collection
    opens with a bracket and cannot span a document marker (``---``/``...`` at a line's
    start ends any scalar and collection), and a block collection nests only under more
    indentation or a compact indicator (two levels per column at most, a sequence sharing
    its key's)."""
    widest = max((len(m.group()) for m in _BLOCK_PREFIX.finditer(text)), default=0)
    flow = max(doc.count("[") + doc.count("{") for doc in _DOCUMENT_MARKER.split(text))
    return flow + 2 * (widest + 1)


class _Frame:
    """A collection being parsed: its anchor, the decode count and depth where it began,
    and the deepest (expanded) nesting reached inside it so far."""

    __slots__ = ("anchor", "decodes_before", "deepest", "depth_before")

    def __init__(self, anchor: str | None, decodes_before: int, depth_before: int) -> None:
        self.anchor = anchor
        self.decodes_before = decodes_before
        self.depth_before = depth_before
        self.deepest = depth_before + 1


class _Measure:
    """Counts of one document as its parse events come."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.anchors: dict[str, tuple[int, int]] = {}  # anchor -> (decodes, levels)
        self.frames: list[_Frame] = []
        self.decodes = 0
        self.from_aliases = 0
        self.depth = 0

    def too_deep(self, depth: int, why: str = "") -> None:
        if depth > MAX_YAML_DEPTH:
            raise UntrustedDataError(
                f"{self.where} nests deeper than {MAX_YAML_DEPTH} levels{why}; refused"
            )

    def start(self, anchor: str | None) -> None:
        self.frames.append(_Frame(anchor, self.decodes, self.depth))
        self.decodes += 1
        self.depth += 1
        self.too_deep(self.depth)

    def end(self) -> None:
        frame = self.frames.pop()
        self.depth -= 1
        if frame.anchor:
            self.anchors[frame.anchor] = (
                self.decodes - frame.decodes_before, frame.deepest - frame.depth_before
            )
        if self.frames:
            self.frames[-1].deepest = max(self.frames[-1].deepest, frame.deepest)

    def alias(self, anchor: str) -> None:
        if any(f.anchor == anchor for f in self.frames):
            raise UntrustedDataError(f"{self.where}: alias *{anchor} is inside its own anchor")
        size, height = self.anchors.get(anchor, (0, 0))  # unknown: the composer will say
        self.decodes += 1 + size
        self.from_aliases += size
        self.too_deep(self.depth + height, f" once alias *{anchor} is expanded")
        if self.frames:
            self.frames[-1].deepest = max(self.frames[-1].deepest, self.depth + height)

    def check(self, size: int) -> None:
        if size > MAX_DOCUMENT_BYTES:
            raise UntrustedDataError(
                f"{self.where}: a document of {size} characters is larger than the "
                f"{MAX_DOCUMENT_BYTES} accepted; refused"
            )
        decodes, from_aliases = self.decodes, self.from_aliases
        if (
            from_aliases > _ALIAS_MIN_ALIASES
            and decodes > _ALIAS_MIN_DECODES
            and from_aliases / decodes > allowed_alias_ratio(decodes)
        ):
            raise UntrustedDataError(
                f"{self.where} contains excessive aliasing ({from_aliases} of {decodes} "
                "values come from aliases); refused"
            )


def _measure(text: str, where: str) -> None:
    """Refuse ``text`` when a document in it is too large, nests (aliases expanded) deeper
    than :data:`MAX_YAML_DEPTH`, holds an alias inside its own anchor, or expands aliases
    beyond go-yaml's rule. One pass over libyaml's parse events: its parser keeps its state
    on a heap stack (safe at any depth) and never expands an alias; each anchor's expanded
    size and height are remembered and added where it is used."""
    yaml = _yaml()
    loader = _loader(text)
    doc = _Measure(where)
    doc_start = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            kind = type(event)
            if kind is yaml.ScalarEvent:
                doc.decodes += 1
                if event.anchor:
                    doc.anchors[event.anchor] = (1, 0)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                doc.start(event.anchor)
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                doc.end()
            elif kind is yaml.AliasEvent:
                doc.alias(event.anchor)
            elif kind is yaml.DocumentStartEvent:
                doc = _Measure(where)
                doc_start = event.start_mark.index
            elif kind is yaml.DocumentEndEvent:
                doc.check(event.end_mark.index - doc_start)
    except yaml.YAMLError as exc:
        raise UntrustedDataError(f"{where} is not valid YAML: {exc}") from exc
    finally:
        loader.dispose()


def load_all(text: str, where: str = "<manifest>") -> list[Any]:
    """Every document of YAML ``text`` (empty documents as None), bounded as above.

    Raises :class:`~kubevol.errors.UntrustedDataError` naming ``where`` for text over the
    limits and for invalid YAML.
    """
    if len(text) > MAX_MANIFEST_BYTES or len(text.encode()) > MAX_MANIFEST_BYTES:
        raise UntrustedDataError(f"{where} is larger than {MAX_MANIFEST_BYTES} bytes; refused")
    if text.lstrip(" \t\r\n-").startswith("{"):
        json_docs = _json_documents(text)
        if json_docs is not None:
            return json_docs
    # The events pass is skipped only when the text itself shows that nothing can go wrong:
    # no alias, no larger than one document may be, shallow by the bound.
    if (
        "*" in text
        or len(text) > MAX_DOCUMENT_BYTES
        or _depth_upper_bound(text) > MAX_YAML_DEPTH
    ):
        _measure(text, where)
    yaml = _yaml()
    loader = _loader(text)
    docs: list[object] = []
    try:
        while loader.check_data():
            docs.append(loader.get_data())
    except yaml.YAMLError as exc:
        raise UntrustedDataError(f"{where} is not valid YAML: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 100,000 digits
        raise UntrustedDataError(f"{where} holds a value that cannot be loaded: {exc}") from exc
    finally:
        loader.dispose()
    return docs


def load(text: str, where: str = "<manifest>") -> Any:
    """The single document of YAML ``text`` (None when empty), bounded as :func:`load_all`.
    Raises :class:`~kubevol.errors.UntrustedDataError` also for several documents."""
    docs = load_all(text, where)
    if len(docs) > 1:
        raise UntrustedDataError(f"{where} holds {len(docs)} YAML documents, expected one")
    return docs[0] if docs else None


def read_manifest(path: str, *, max_bytes: int = MAX_MANIFEST_BYTES) -> str:
    """The text of manifest file ``path`` (UTF-8), refused past ``max_bytes``.

    Unlike metadata files, a manifest is what the user named: a link, ``/dev/stdin`` or a
    FIFO from a shell's process substitution are fine; only the amount read is bounded.
    Raises ``OSError`` when it cannot be read, :class:`~kubevol.errors.UntrustedDataError`
    when it is too large or not UTF-8.
    """
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UntrustedDataError(f"{path} is larger than {max_bytes} bytes; refused")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedDataError(f"{path} is not UTF-8 text: {exc}") from exc
