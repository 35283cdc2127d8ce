"""Waiting in tests for something another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` every 10 ms until it is true; fail the test (AssertionError naming
    ``what``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.01)
