"""Benchmarks that check kubevol's speed targets against the strongest reference that runs on
the same machine, measured in the same run. Run one with ``python -m benchmarks.<name>``, all
of them with ``make bench`` (``python -m benchmarks``), which prints one table."""
