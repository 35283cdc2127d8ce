"""How a served driver logs: one scheme for a driver started by its own console script, by
an application that embeds it, and by ``kubevol driver serve``.

What a driver logs (the lines Go drivers print through klog and gocsi):

- its start, at INFO: ``serving NAME (MODE) on ENDPOINT``;
- every failed call, at ERROR: ``METHOD failed: CODE: message`` (an unexpected exception
  with its traceback);
- with ``X_CSI_REQ_LOGGING`` / ``X_CSI_REP_LOGGING`` (or ``X_CSI_DEBUG``), each request and
  response at INFO, secrets redacted, whatever the level (gocsi writes them whatever
  logrus's level is).

Where the lines go, and how much shows (:func:`driver_logging`, which
:func:`~kubevol.csidriver.server.serve` applies while it serves):

- **Nothing configured** (no handler would receive kubevol's records: a driver's own
  ``main``): one handler on stderr, lines ``<time> <LEVEL> <logger>: <message>`` (the format
  of ``kubevol driver serve``), on the root logger at ``X_CSI_LOG_LEVEL`` (INFO when unset,
  as gocsi applies), so the driver's own loggers follow the same level. Both are undone
  when ``serve`` returns.
- **The embedding application configured logging** (a handler exists, ``kubevol``'s CLI
  included): its handlers, formats and levels stay; a library does not clobber its host's
  logging. ``X_CSI_LOG_LEVEL``, *when set*, sets the level of the ``kubevol`` logger,
  unless the application set that logger's level itself: ``kubevol -v N driver serve``
  does, so an explicit ``-v`` wins over the variable. Unset, nothing changes.

:func:`~kubevol.csidriver.server.serve_in_background` configures nothing (a test, demo or
agent embedding a driver owns its logging); its start and failed-call lines go to kubevol's
loggers as above.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from kubevol.csidriver.server.config import ServerConfig
from kubevol.csidriver.server.middleware.logging import LOGGER_NAME as CALL_LOGGER

#: The logger of the serving framework: the start line and failed calls.
SERVER_LOGGER = "kubevol.csidriver.server"

#: The line format of the stderr handler :func:`driver_logging` sets up (the CLI's daemons').
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The level when ``X_CSI_LOG_LEVEL`` is unset and the driver configures its own logging.
DEFAULT_LEVEL = logging.INFO


def logging_configured() -> bool:
    """Whether a handler would receive the framework's records (Python's last-resort
    handler, which prints warnings when nothing is configured, does not count)."""
    return logging.getLogger(SERVER_LOGGER).hasHandlers()


@contextlib.contextmanager
def driver_logging(config: ServerConfig) -> Iterator[None]:
    """Apply the scheme of this module's docstring for ``config`` while the block runs;
    everything it changed is restored on exit."""
    undo: list[Callable[[], None]] = []
    try:
        _configure(config, undo)
        yield
    finally:
        for step in reversed(undo):
            step()


def _set_level(logger: logging.Logger, level: int, undo: list[Callable[[], None]]) -> None:
    previous = logger.level
    logger.setLevel(level)
    undo.append(lambda: logger.setLevel(previous))


def _configure(config: ServerConfig, undo: list[Callable[[], None]]) -> None:
    root = logging.getLogger()
    if not logging_configured():
        handler = logging.StreamHandler()  # stderr
        handler.setFormatter(logging.Formatter(LINE_FORMAT))
        root.addHandler(handler)
        undo.append(lambda: root.removeHandler(handler))
        _set_level(root, DEFAULT_LEVEL if config.log_level is None else config.log_level, undo)
    elif config.log_level is not None:
        kubevol = logging.getLogger("kubevol")
        if kubevol.level == logging.NOTSET:  # else: the application chose, and it wins
            _set_level(kubevol, config.log_level, undo)
    if config.req_logging or config.rep_logging:
        calls = logging.getLogger(CALL_LOGGER)
        if not calls.isEnabledFor(logging.INFO):
            _set_level(calls, logging.INFO, undo)
