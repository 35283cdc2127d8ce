"""JSON text as the standard library's ``json`` writes it, written by orjson where it can.

``json`` indents in pure Python (its C encoder serves only the compact form), a visible
share of a large ``-o json`` and of the pod records a tear-down writes before it can
start; orjson writes the same text many times faster (figures: benchmarks/README.md). Where the two
would differ, ``json`` writes it: orjson refuses integers beyond 64 bits, lone surrogates
and keys that are not strings, and writes non-ASCII characters as they are where ``json``
escapes them. One difference is left: a float NaN or infinity is ``null`` (``json``'s
``NaN`` is not JSON).
"""

from __future__ import annotations

import json

import orjson


def dumps(plain: object, *, indent: bool = False, sort_keys: bool = False) -> str:
    """``plain`` (JSON values) as ``json.dumps`` writes it byte for byte: indented by two
    spaces with ``indent``, else compact (``separators=(",", ":")``); keys sorted with
    ``sort_keys``. Raises ``TypeError``/``ValueError`` for what is not JSON."""
    option = (orjson.OPT_INDENT_2 if indent else 0) | (orjson.OPT_SORT_KEYS if sort_keys else 0)
    try:
        text = orjson.dumps(plain, option=option).decode()
    except orjson.JSONEncodeError:
        text = ""
    if text and text.isascii():
        return text
    if indent:
        return json.dumps(plain, indent=2, sort_keys=sort_keys)
    return json.dumps(plain, separators=(",", ":"), sort_keys=sort_keys)
