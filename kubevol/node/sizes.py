"""The size each volume has on the node, remembered across restarts: under
``<root>/kubevol/volume-sizes/``, one file per volume, named by the SHA-256 of its unique
name and holding ``{"volume": <unique name>, "size": <bytes>}``.

The kubelet keeps this figure in the claim's ``status.capacity`` through the API server:
after a restart it initialises the size it knows from there (``InitializeClaimSize``) and
expands on the node when the PersistentVolume's capacity is larger. kubevol runs without an
API server (``kubevol up``, an agent on static manifests), so it keeps the figure itself:
written when a volume is first set up (or mapped) and after each node expansion, removed when
the volume leaves the node. A file that cannot be read, or names another volume, counts as
absent: a lost figure costs at most one NodeExpandVolume, which drivers must accept again.
"""

from __future__ import annotations

import logging
import os

from kubevol.layout import json_document, remove_files, sha256_hex, write_files_atomically
from kubevol.node.records import STATE_DIR
from kubevol.util.safeio import load_json_file

log = logging.getLogger(__name__)

#: The directory under ``<root>/kubevol/``.
SIZES_DIR = "volume-sizes"


class VolumeSizes:
    """The sizes of the volumes on one root (see the module's docstring). Thread-safe: each
    file is written atomically and belongs to one volume, whose operations are serialised."""

    def __init__(self, root_dir: str) -> None:
        self.dir = os.path.join(root_dir, STATE_DIR, SIZES_DIR)

    def _path(self, unique_name: str) -> str:
        return os.path.join(self.dir, sha256_hex(unique_name) + ".json")

    def get(self, unique_name: str) -> int | None:
        """The size recorded for ``unique_name``, or None (none, or not readable)."""
        path = self._path(unique_name)
        try:
            data = load_json_file(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring the recorded size of %s: %s", unique_name, exc)
            return None
        size = data.get("size") if isinstance(data, dict) else None
        if (
            not isinstance(data, dict)
            or data.get("volume") != unique_name
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
        ):
            log.warning("ignoring %s: not the recorded size of %s", path, unique_name)
            return None
        return size

    def set(self, unique_name: str, size: int) -> None:
        """Record ``size`` bytes for ``unique_name`` (atomically). A failure is logged: the
        volume works on, and a restart may expand it once more."""
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            write_files_atomically(
                [(self._path(unique_name), json_document({"volume": unique_name, "size": size}))]
            )
        except OSError as exc:
            log.warning("cannot record the size of %s: %s", unique_name, exc)

    def forget(self, unique_name: str) -> None:
        """Remove the record of ``unique_name`` (absent is fine; a failure is logged)."""
        try:
            remove_files([self._path(unique_name)])
        except OSError as exc:
            log.warning("cannot remove the recorded size of %s: %s", unique_name, exc)
