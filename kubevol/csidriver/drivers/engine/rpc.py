"""Small helpers the bundled drivers' services share: failing a call with the right status,
required fields, opaque page tokens, and reading capabilities from requests."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

import grpc
from google.protobuf.message import Message

from kubevol.csi import convert, pb
from kubevol.csi import types as t
from kubevol.csi.errors import CSIRPCError

T = TypeVar("T")

Code = grpc.StatusCode


def fail(code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with ``code`` and ``message``."""
    raise CSIRPCError(code, message)


def require(value: object, field: str) -> None:
    """INVALID_ARGUMENT unless ``value`` (a request field) is set and non-empty."""
    if not value:
        fail(Code.INVALID_ARGUMENT, f"{field} is required")


def require_field(request: Message, field: str) -> None:
    """INVALID_ARGUMENT unless message field ``field`` of ``request`` is set."""
    if not request.HasField(field):
        fail(Code.INVALID_ARGUMENT, f"{field} is required")


def absolute_path(value: str, field: str) -> str:
    """The normalised absolute path in ``field``; INVALID_ARGUMENT when missing or relative."""
    require(value, field)
    if not value.startswith("/") or "\0" in value:
        fail(Code.INVALID_ARGUMENT, f"{field} {value!r} must be an absolute path")
    path = os.path.normpath(value)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if path == "/":
        # Staging or publishing at the root would mount over (or bind out) the host's root.
        fail(Code.INVALID_ARGUMENT, f"{field} {value!r} is the root directory")
    return path


def capability(request: Message, field: str = "volume_capability") -> t.VolumeCapability:
    """The single capability in ``field``; INVALID_ARGUMENT when missing or incomplete."""
    require_field(request, field)
    return _checked(getattr(request, field), field)


def capabilities(request: Message, field: str = "volume_capabilities") -> list[t.VolumeCapability]:
    """The capabilities list in ``field``; INVALID_ARGUMENT when empty or one is incomplete."""
    items = list(getattr(request, field))
    require(items, field)
    return [_checked(item, f"{field}[{i}]") for i, item in enumerate(items)]


def _checked(msg: pb.VolumeCapability, field: str) -> t.VolumeCapability:
    if msg.WhichOneof("access_type") is None:
        fail(Code.INVALID_ARGUMENT, f"{field}: access_type (mount or block) is required")
    if not msg.HasField("access_mode") or msg.access_mode.mode == 0:
        fail(Code.INVALID_ARGUMENT, f"{field}: access_mode is required")
    if int(msg.access_mode.mode) not in t.AccessMode.__members__.values():
        fail(Code.INVALID_ARGUMENT, f"{field}: unknown access mode {msg.access_mode.mode}")
    return convert.capability_from_pb(msg)


# --- pagination ---------------------------------------------------------------------

_TOKEN_PREFIX = "kv1:"


def make_token(key: str) -> str:
    """An opaque token meaning "continue after ``key``"."""
    return base64.urlsafe_b64encode((_TOKEN_PREFIX + key).encode()).decode()


def read_token(token: str) -> str:
    """The key a :func:`make_token` token continues after; ABORTED for anything else.

    The spec answers a starting token the plugin does not recognise with ABORTED.
    """
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    if not text.startswith(_TOKEN_PREFIX):
        fail(Code.ABORTED, f"starting_token {token!r} is not a token this driver issued")
    return text[len(_TOKEN_PREFIX) :]


def paginate(
    items: Sequence[T], key: Callable[[T], str], max_entries: int, starting_token: str
) -> tuple[list[T], str]:
    """One page of ``items`` in ``key`` order, and the token for the next page ("" at the end).

    Tokens name the last key returned, not an index, so entries deleted between pages do not
    make the next page skip or repeat others. A negative ``max_entries`` is INVALID_ARGUMENT;
    0 means no limit; a foreign token is ABORTED.
    """
    if max_entries < 0:
        fail(Code.INVALID_ARGUMENT, f"max_entries must not be negative, got {max_entries}")
    ordered = sorted(items, key=key)
    if starting_token:
        after = read_token(starting_token)
        ordered = [item for item in ordered if key(item) > after]
    if max_entries == 0 or len(ordered) <= max_entries:
        return ordered, ""
    page = ordered[:max_entries]
    return page, make_token(key(page[-1]))
