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

from kubevol.cli import exits
from kubevol.cli.output import Column, Table, add_output_flags, columns, emit
from kubevol.cli.parser import DURATION
from kubevol.metrics import MetricsBlock, MetricsDu, MetricsProvider, MetricsStatFS
from kubevol.mount.probe import PathProbe, UnresponsiveError

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


#: What ``provider`` shows for each provider class.
PROVIDER_NAMES: dict[type[MetricsProvider], str] = {
    MetricsDu: "du",
    MetricsStatFS: "statfs",
    MetricsBlock: "block",
}

TABLE = Table(
    columns=columns(
        "path",
        "provider",
        Column("method", wide=True),
        Column("used", size=True),
        Column("capacity", size=True),
        Column("available", size=True),
        "inodes_used",
        "inodes",
        "inodes_free",
        Column("time", wide=True),
    )
)


def measure(path: str, provider: MetricsProvider) -> dict[str, object]:
    """``path``'s metrics as one record: which provider measured, how (``method``: for du
    ``quota``, ``walk (native)`` or ``walk (python)``; else the provider), and the figures."""
    method = PROVIDER_NAMES[type(provider)]
    if isinstance(provider, MetricsDu):
        with WalkProgress(sys.stderr, path):
            metrics, usage = provider.measure()
        method = "quota" if usage.source == "quota" else f"walk ({usage.walker})"
    else:
        metrics = provider.get_metrics()
    figures = attrs.asdict(metrics)
    for unset in ("abnormal", "message"):  # CSI volume conditions: never set by these
        figures.pop(unset, None)
    return {"path": path, "provider": PROVIDER_NAMES[type(provider)], "method": method,
            **figures}


def run(args: argparse.Namespace) -> int:
    # PATH may be below a dead server or a frozen FUSE daemon, where even the stat that
    # picks the provider blocks: the whole measurement runs with the --timeout deadline
    # (kubevol.mount.probe), and a thread left stuck ends with the process.
    try:
        record = PathProbe(args.timeout).call(
            args.path, args.path, f"measuring with {args.provider}",
            lambda: measure(args.path, choose_provider(args.path, args.provider)))
    except UnresponsiveError as exc:
        return exits.report_unresponsive([(args.path, str(exc))])
    emit(record, TABLE, args, sys.stdout)
    return exits.OK


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
    parser.add_argument("--timeout", type=DURATION, default=60.0,
                        help="how long measuring may take; past it PATH is reported "
                        f"unresponsive (exit {exits.UNRESPONSIVE}) and nothing is printed: a "
                        "Go duration (30s, 2m) or seconds (default: 60)")
    add_output_flags(parser)
    parser.set_defaults(func=run)
