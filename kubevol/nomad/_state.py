"""Small JSON state files written atomically: the registry and the usage tracker persist
through them, so a crash mid-write leaves either the old state or the new, never half."""

from __future__ import annotations

import os

from kubevol.layout import write_json_atomically
from kubevol.nomad.errors import ManagerStateError
from kubevol.util.safeio import load_json_file

#: Bumped when the layout of a state file changes incompatibly.
STATE_VERSION = 1


def write_state(path: str, kind: str, payload: object) -> None:
    """Replace ``path`` with ``{"kind", "version", "data": payload}`` as JSON, atomically.

    Writes a temporary file in the same directory (mode 0600), fsyncs it, renames it over
    ``path`` and fsyncs the directory. Creates the directory if needed. Raises
    :class:`ManagerStateError` naming the file when any step fails; the old file is then
    left untouched.
    """
    directory = os.path.dirname(path) or "."
    document = {"kind": kind, "version": STATE_VERSION, "data": payload}
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        write_json_atomically(path, document)
    except OSError as exc:
        raise ManagerStateError(f"cannot write {kind} state to {path!r}: {exc}") from exc


def read_state(path: str, kind: str) -> object:
    """The ``data`` of a file written by :func:`write_state`, or None when it does not exist.

    Raises :class:`ManagerStateError` when the file cannot be read, is not JSON, holds
    another kind of state or a version this kubevol does not know.
    """
    try:
        document = load_json_file(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ManagerStateError(f"cannot read {kind} state from {path!r}: {exc}") from exc
    if not isinstance(document, dict) or document.get("kind") != kind:
        raise ManagerStateError(f"{path!r} does not hold {kind} state")
    if document.get("version") != STATE_VERSION:
        raise ManagerStateError(
            f"{path!r} holds {kind} state version {document.get('version')!r}; "
            f"this kubevol reads version {STATE_VERSION}"
        )
    return document.get("data")
