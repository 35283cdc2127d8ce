"""When the service-account tokens of the pods need a refresh, kept across restarts in
``<root>/kubevol/token-refresh.json`` (pod UID -> time, never a token): a restarted agent
knows that the tokens its pods' projected volumes hold are not due yet, and sets none of
them up again to renew them (a token manager starts empty; the kubelet's renews every
token at its first pod sync).

What is read back is checked: a file that cannot be read or is not such a mapping is
ignored (the tokens are then renewed, as without it), and no time is taken later than a
token can go without a refresh (24 hours from now)."""

from __future__ import annotations

import datetime
import logging
import os

from kubevol.k8s.tokens import MAX_TTL, TokenManager
from kubevol.layout import write_json_atomically
from kubevol.node.records import STATE_DIR
from kubevol.util.safeio import load_json_file

log = logging.getLogger(__name__)

#: The file's name under ``<root>/kubevol/``.
FILE_NAME = "token-refresh.json"


class TokenRefreshTimes:
    """The refresh times of one root's tokens, loaded into and saved from a
    :class:`~kubevol.k8s.tokens.TokenManager`."""

    def __init__(self, root_dir: str) -> None:
        self.path = os.path.join(root_dir, STATE_DIR, FILE_NAME)
        self._saved: int | None = None

    def load(self, tokens: TokenManager) -> None:
        """Tell ``tokens`` when the tokens of the pods in the file need a refresh."""
        try:
            data = load_json_file(self.path)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s (tokens are renewed at once): %s", self.path, exc)
            return
        latest = datetime.datetime.now(datetime.UTC) + MAX_TTL
        times: dict[str, datetime.datetime] = {}
        for uid, value in data.items() if isinstance(data, dict) else ():
            try:
                when = datetime.datetime.fromisoformat(str(value))
            except ValueError:
                continue
            if isinstance(uid, str) and when.tzinfo is not None:
                times[uid] = min(when, latest)
        tokens.expect_refresh(times)
        self._saved = tokens.version

    def save_if_changed(self, tokens: TokenManager) -> None:
        """Write the refresh times of ``tokens`` if they may have changed since the last
        save; a failure is logged (a restart then renews the tokens)."""
        version = tokens.version
        if version == self._saved:
            return
        times = {uid: when.isoformat() for uid, when in tokens.refresh_times().items()}
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            write_json_atomically(self.path, times)
        except OSError as exc:
            log.warning("cannot save the token refresh times: %s", exc)
            return
        self._saved = version
