"""``kubevol metrics PATH``: measure a volume the way the kubelet does."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

import attrs

from kubevol.cli.output import add_output_flag, render
from kubevol.metrics import MetricsBlock, MetricsDu, MetricsProvider, MetricsStatFS

PROVIDERS = ("du", "statfs", "block", "auto")


class WalkProgress:
    """Shows on ``stream`` that a long walk is still running, if ``stream`` is a terminal.

    Nothing is written before ``delay`` seconds, nor ever when ``stream`` is not a TTY
    (so redirected output stays clean). Then the elapsed time is rewritten in place every
    ``interval`` seconds, and the line is cleared when the context exits.
    """

    def __init__(
        self, stream: TextIO, label: str, *, delay: float = 1.0, interval: float = 0.25
    ) -> None:
        self.stream = stream
        self.label = label
        self.delay = delay
        self.interval = interval
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def __enter__(self) -> WalkProgress:
        if self.stream.isatty():
            self._thread = threading.Thread(target=self._run, name="walk-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def _run(self) -> None:
        start = time.monotonic()
        if self._done.wait(self.delay):
            return
        while True:
            self._shown = True
            self.stream.write(f"\r{self.label}: walking... {time.monotonic() - start:.1f}s")
            self.stream.flush()
            if self._done.wait(self.interval):
                return


def choose_provider(path: str, name: str) -> MetricsProvider:
    """The provider ``name`` for ``path``; ``auto`` picks ``block`` for a block device, else du."""
    if name == "statfs":
        return MetricsStatFS(path)
    if name == "block":
        return MetricsBlock(path)
    if name == "auto":
        try:
            is_block = stat.S_ISBLK(os.stat(path).st_mode)
        except OSError:
            is_block = False  # MetricsDu reports the missing path with the right error code
        if is_block:
            return MetricsBlock(path)
    return MetricsDu(path)


def run(args: argparse.Namespace) -> int:
    provider = choose_provider(args.path, args.provider)
    if isinstance(provider, MetricsDu):
        with WalkProgress(sys.stderr, args.path):
            metrics = provider.get_metrics()
    else:
        metrics = provider.get_metrics()
    data = attrs.asdict(metrics)
    row = {"path": args.path, "provider": type(provider).__name__, **data}
    columns = (
        "path",
        "provider",
        "used",
        "capacity",
        "available",
        "inodes_used",
        "inodes",
        "inodes_free",
    )
    render(data, args.output, sys.stdout, rows=[row], columns=columns)
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Measure PATH as the kubelet measures volumes. du: the directory's own bytes "
        "and inodes (one filesystem, hard links once; O(1) from a project quota where "
        "there is one) plus its filesystem's totals; statfs: the whole filesystem; "
        "block: a block device's capacity; auto: block for a block device, else du."
    )
    parser.add_argument("path", metavar="PATH", help="volume directory or block device")
    parser.add_argument(
        "--provider", choices=PROVIDERS, default="auto", help="how to measure (default: auto)"
    )
    add_output_flag(parser, ("table", "json", "yaml"))
    parser.set_defaults(func=run)
