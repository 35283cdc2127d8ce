"""``vol_data.json``: what the CSI plugin records beside each mount so that it can tear the
mount down, and a restarted agent can rebuild its state, without the API server.

The file is a flat JSON object of strings with the kubelet's keys, written the way Go's
``json.Encoder`` writes a ``map[string]string`` (sorted keys, no spaces, ``<``, ``>`` and
``&`` escaped, a final newline), so a kubelet and kubevol can read each other's files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from kubevol.errors import KubevolError, UntrustedDataError
from kubevol.layout import CSI_VOL_DATA_TEMP_PREFIX, csi_vol_data_path, write_file_atomically
from kubevol.util.safeio import parse_json, read_regular_file

KEY_SPEC_VOL_ID = "specVolID"
KEY_VOLUME_HANDLE = "volumeHandle"
KEY_DRIVER_NAME = "driverName"
KEY_NODE_NAME = "nodeName"
KEY_ATTACHMENT_ID = "attachmentID"
KEY_LIFECYCLE_MODE = "volumeLifecycleMode"
KEY_SELINUX_MOUNT_CONTEXT = "seLinuxMountContext"

#: vol_data.json is a few hundred bytes (its volume attributes make it longer): far more
#: than any real one, far less than a reader could be made to swallow.
MAX_VOL_DATA_BYTES = 1024 * 1024


class VolumeDataError(KubevolError, ValueError):
    """A ``vol_data.json`` is unreadable, not a JSON object of strings, or lacks a key."""


class VolumeDataMissingError(VolumeDataError, FileNotFoundError):
    """There is no ``vol_data.json`` where one was expected."""


def _go_json(data: Mapping[str, str]) -> str:
    text = json.dumps(dict(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # encoding/json escapes these for safe embedding in HTML; do the same, byte for byte.
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text


def vol_data_path(directory: str) -> str:
    """``<directory>/vol_data.json``."""
    return csi_vol_data_path(directory)


def save_volume_data(directory: str, data: Mapping[str, str]) -> None:
    """Write ``<directory>/vol_data.json`` atomically and durably (``directory`` must exist).

    Raises ``OSError`` when it cannot be written; no partial file is ever left.
    """
    # json.Encoder.Encode ends with a newline; 0644 is what os.Create gives under the usual
    # umask.
    write_file_atomically(
        vol_data_path(directory),
        (_go_json(data) + "\n").encode(),
        mode=0o644,
        temp_prefix=CSI_VOL_DATA_TEMP_PREFIX,
    )


def load_volume_data(directory: str) -> dict[str, str]:
    """Read ``<directory>/vol_data.json``.

    Raises :class:`VolumeDataMissingError` when it does not exist and
    :class:`VolumeDataError` when it cannot be read or is not a JSON object of strings.
    """
    path = vol_data_path(directory)
    # Not a plain open: the file may be a FIFO, a link to /dev/zero or nested 100,000 deep
    # (kubevol.util.safeio refuses those, in four system calls for the usual file: this runs
    # once per volume when a node is reconstructed).
    try:
        raw = read_regular_file(path, max_bytes=MAX_VOL_DATA_BYTES)
    except FileNotFoundError as exc:
        raise VolumeDataMissingError(f"volume data file [{path}] does not exist") from exc
    except (OSError, UntrustedDataError) as exc:
        raise VolumeDataError(f"failed to open volume data file [{path}]: {exc}") from exc
    try:
        data = parse_json(raw, path)
    except UntrustedDataError as exc:
        raise VolumeDataError(f"failed to parse volume data file [{path}]: {exc}") from exc
    # JSON object keys are always strings; the values must be too (checked without a
    # Python-level loop: this runs once per volume when a node is reconstructed).
    if not isinstance(data, dict) or not set(map(type, data.values())) <= {str}:
        raise VolumeDataError(
            f"failed to parse volume data file [{path}]: expected a JSON object of strings"
        )
    return data


def require(data: Mapping[str, str], directory: str, *keys: str) -> tuple[str, ...]:
    """The values of ``keys`` in ``data``; :class:`VolumeDataError` naming the first missing."""
    values = []
    for key in keys:
        value = data.get(key, "")
        if not value:
            raise VolumeDataError(f"volume data file [{vol_data_path(directory)}] has no {key!r}")
        values.append(value)
    return tuple(values)


def with_context(exc: VolumeDataError, context: str) -> VolumeDataError:
    """``exc`` again, same class (missing stays missing), its message prefixed by ``context``."""
    return type(exc)(f"{context}: {exc}")
