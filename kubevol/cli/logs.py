"""One logging scheme for every ``kubevol`` command: ``-v N`` (klog's verbosity, 0-10) and
``--log-format text|json``, set up once, so that each message is printed once.

Verbosity follows klog's convention as the kubelet uses it: 0 shows warnings and errors,
1-3 add informational messages (what was mounted, torn down, registered), 4 and more add
debug detail. The long-running commands (``agent``, ``driver serve``) default to 2, as a
kubelet runs; one-shot commands default to 0 so their output stays their answer. A driver
served by ``driver serve`` logs through the same handler (its start, failed calls, requests:
:mod:`kubevol.csidriver.server.logs`); ``X_CSI_LOG_LEVEL`` applies there only when set, and
an explicit ``-v`` wins over it.

Text lines are ``warning: <message>`` for one-shot commands and timestamped
``<time> <level> <logger>: <message>`` for daemons. JSON lines are one object each with
klog's ``ts`` (seconds since the epoch), ``v``, ``msg``, plus ``level`` and ``logger`` (and
``exc`` when an exception is logged). The JSON formatter is written here, on the standard
library's logging and json, because it is a dozen lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TextIO

#: The most verbose level klog defines.
MAX_VERBOSITY = 10


def verbosity_level(v: int) -> int:
    """The Python logging level that ``-v v`` shows."""
    if v <= 0:
        return logging.WARNING
    if v <= 3:
        return logging.INFO
    return logging.DEBUG


def _verbosity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number from 0 to 10") from None
    if not 0 <= value <= MAX_VERBOSITY:
        raise argparse.ArgumentTypeError(f"{value} is not from 0 to {MAX_VERBOSITY}")
    return value


def add_logging_flags(parser: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """``-v/--v N`` and ``--log-format`` on the main parser (before the command); with
    ``after_command``, on a command's parser too (``kubevol status -v 3``), defaulting to
    what the main parser took, and without ``-v`` where the command has a ``-v`` of its own
    (``driver serve``'s ``--debug``): ``--v N`` works there."""
    taken = parser._option_string_actions
    default: object = argparse.SUPPRESS if after_command else None
    names = [n for n in ("-v", "--v") if n not in taken]
    if names:
        parser.add_argument(
            *names, dest="verbosity", type=_verbosity, default=default, metavar="N",
            help="log verbosity, klog's 0-10: 0 warnings and errors, 1-3 information, "
            "4+ debug (default: 0; 2 for agent and driver serve)",
        )
    if "--log-format" not in taken:
        parser.add_argument(
            "--log-format", choices=("text", "json"),
            default=argparse.SUPPRESS if after_command else "text",
            help="log lines as text or as one JSON object each (default: text)",
        )


class _TextFormatter(logging.Formatter):
    """``warning: message`` (level in lower case, as command-line tools print it)."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.levelname.lower()}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class JSONFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``v``, ``level``, ``logger``, ``msg`` [, ``exc``]."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 6),
            "v": 0 if record.levelno >= logging.INFO else 4,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (it may be replaced
    after set-up, e.g. by a test's capture)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def setup_logging(
    verbosity: int | None, log_format: str = "text", *, daemon: bool = False,
    stream: TextIO | None = None,
) -> None:
    """Configure the root logger once: one handler on ``stream`` (stderr), the level that
    ``verbosity`` means (None: the command's default). Replaces handlers set before, so a
    second call (tests) does not print messages twice."""
    v = verbosity if verbosity is not None else (2 if daemon else 0)
    handler: logging.Handler = (
        logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    )
    if log_format == "json":
        handler.setFormatter(JSONFormatter())
    elif daemon:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
    else:
        handler.setFormatter(_TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(verbosity_level(v))
    # kubevol's own loggers follow the root's level unless a command pins them (``driver
    # serve`` does for an explicit -v, so that X_CSI_LOG_LEVEL does not override it); a
    # second call (tests) starts from the root's level again.
    logging.getLogger("kubevol").setLevel(logging.NOTSET)
    # Third-party libraries stay quiet below warnings unless debugging.
    for name in ("urllib3", "kubernetes"):
        logging.getLogger(name).setLevel(logging.DEBUG if v >= 6 else logging.WARNING)
