"""The one timing helper of the benchmarks (the median wall time of repeated calls) and their
smoke mode.

``ZEROLIB_BENCH_SMOKE=1`` (``python benchmarks/run.py --smoke``, which CI runs) makes every
benchmark run once at a small size: each timed call runs once and each size is its small
value, so that a benchmark that raises or whose sides stop agreeing fails CI within seconds.
Its ratios mean nothing then and are never judged.
"""
from __future__ import annotations

import os
import statistics
import time

SMOKE = os.environ.get("ZEROLIB_BENCH_SMOKE", "") not in ("", "0")


def size(full, smoke):
    """``full``, or ``smoke`` in smoke mode."""
    return smoke if SMOKE else full


def median_seconds(fn, repeats: int, before=None) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` (one in smoke mode); ``before`` (untimed)
    runs ahead of each, e.g. to clear a memo so that every run starts cold."""
    times = []
    for _ in range(size(repeats, 1)):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
