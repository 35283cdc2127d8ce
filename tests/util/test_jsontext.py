"""kubevol.util.jsontext writes what json writes, byte for byte, however it gets there."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubevol.util import jsontext

DOCUMENTS: list[Any] = [
    {"b": [1, 2.5, None, True], "a": {"z": "x", "y": []}, "c": {}},
    [],
    "plain",
    {"naïve": "café", "snow": "\u2603"},  # json escapes non-ASCII; orjson would not
    {"big": 2**70, "small": -(2**63)},  # beyond 64 bits: orjson refuses
    {"lone": "\ud800"},  # a lone surrogate: orjson refuses
]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("indent", [False, True])
@pytest.mark.parametrize("sort_keys", [False, True])
def test_the_text_is_json_dumps_text(document: Any, indent: bool, sort_keys: bool) -> None:
    want = (
        json.dumps(document, indent=2, sort_keys=sort_keys)
        if indent
        else json.dumps(document, separators=(",", ":"), sort_keys=sort_keys)
    )
    assert jsontext.dumps(document, indent=indent, sort_keys=sort_keys) == want


@pytest.mark.parametrize("indent", [False, True])
def test_a_key_that_is_not_a_string_is_written_as_json_writes_it(indent: bool) -> None:
    document = {1: "int key", "2": "str key"}  # json writes "1"; orjson refuses
    want = json.dumps(document, indent=2) if indent else json.dumps(document, separators=(",", ":"))
    assert jsontext.dumps(document, indent=indent) == want


def test_what_is_not_json_is_refused() -> None:
    with pytest.raises(TypeError):
        jsontext.dumps({"x": object()})
