"""Copies of CSI messages that are safe to log: every ``csi_secret`` field is stripped, and
the volume context's service-account tokens.

Which fields are secret is read from the ``(csi.v1.csi_secret)`` field option of the
descriptors, recursively: a secret nested in any sub-message, repeated message or map of
messages is found too (gocsi only drops top-level fields named "Secrets").
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping, MutableSequence
from typing import Protocol, TypeVar, cast

from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from kubevol.csi._pb import csi_pb2

#: What a secret value is replaced with.
STRIPPED = "***stripped***"
#: Volume-context keys whose values are credentials though the spec does not mark them
#: (the pod's service-account tokens the kubelet hands drivers with ``tokenRequests``).
SECRET_CONTEXT_KEYS = frozenset({"csi.storage.k8s.io/serviceAccount.tokens"})

_M = TypeVar("_M", bound=Message)


def _is_secret(field: FieldDescriptor) -> bool:
    return bool(field.GetOptions().Extensions[csi_pb2.csi_secret])


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


class _NewerFieldDescriptor(Protocol):
    """A field descriptor of the protobuf releases that have ``is_repeated``."""

    @property
    def is_repeated(self) -> bool: ...


def is_repeated(field: FieldDescriptor | _NewerFieldDescriptor) -> bool:
    """Whether a field descriptor is a repeated (or map) field, on every protobuf release:
    ``is_repeated`` where it exists (newer releases, which dropped ``label``), else
    ``label`` (protobuf 5.x, which has no ``is_repeated``)."""
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    old = cast(FieldDescriptor, field)  # no is_repeated: a protobuf 5.x descriptor
    return bool(old.label == old.LABEL_REPEATED)


class Redactor:
    """Strips secrets, and optionally volume contexts, from copies of messages. Thread-safe."""

    def __init__(self, *, drop_volume_context: bool = False) -> None:
        self.drop_volume_context = drop_volume_context
        self._lock = threading.Lock()
        self._sensitive: dict[str, bool] = {}

    def _has_sensitive(self, descriptor: Descriptor, seen: frozenset[str] = frozenset()) -> bool:
        """Whether messages of this type can hold anything to strip (cached per type)."""
        name = descriptor.full_name
        with self._lock:
            cached = self._sensitive.get(name)
        if cached is not None:
            return cached
        found = False
        for field in descriptor.fields:
            if _is_secret(field) or field.name == "volume_context":
                found = True
                break
            sub = field.message_type
            if (
                sub is not None
                and sub.full_name not in seen
                and self._has_sensitive(sub, seen | {name})
            ):
                found = True
                break
        with self._lock:
            self._sensitive[name] = found
        return found

    def redact(self, message: _M) -> _M:
        """A copy of ``message`` with every secret value replaced by :data:`STRIPPED`.

        Map keys are kept (they name the secrets, not their values); a secret sub-message is
        cleared. Returns ``message`` itself when its type holds nothing to strip.
        """
        if not self._has_sensitive(message.DESCRIPTOR):
            return message
        copy = type(message)()
        copy.CopyFrom(message)
        self._strip(copy)
        return copy

    def _strip(self, message: Message) -> None:
        for field, value in message.ListFields():
            if field.name == "volume_context":
                if self.drop_volume_context:
                    message.ClearField(field.name)
                else:
                    for key in SECRET_CONTEXT_KEYS & set(value):
                        value[key] = STRIPPED
            elif _is_secret(field):
                _strip_field(message, field)
            elif field.message_type is not None and self._has_sensitive(field.message_type):
                if _is_map(field):
                    value_field = field.message_type.fields_by_name["value"]
                    if value_field.message_type is not None:
                        for item in value.values():
                            self._strip(item)
                elif is_repeated(field):
                    for item in value:
                        self._strip(item)
                else:
                    self._strip(value)

    def to_text(self, message: object) -> str:
        """The redacted message on one line, in protobuf text format (``message`` must be a
        protobuf message: a relay hands on whatever it was given)."""
        if not isinstance(message, Message):
            raise TypeError(f"not a protobuf message: {type(message).__name__}")
        return str(text_format.MessageToString(self.redact(message), as_one_line=True))


def _strip_field(message: Message, field: FieldDescriptor) -> None:
    if _is_map(field):
        value_field = field.message_type.fields_by_name["value"]
        if value_field.type == value_field.TYPE_STRING:
            secrets: MutableMapping[str, str] = getattr(message, field.name)
            for key in list(secrets):
                secrets[key] = STRIPPED
        else:
            message.ClearField(field.name)
    elif field.type == field.TYPE_STRING:
        if is_repeated(field):
            values: MutableSequence[str] = getattr(message, field.name)
            values[:] = [STRIPPED] * len(values)
        else:
            setattr(message, field.name, STRIPPED)
    else:
        message.ClearField(field.name)
