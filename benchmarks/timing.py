"""The one timing helper of the benchmarks: the median wall time of repeated calls."""
from __future__ import annotations

import statistics
import time


def median_seconds(fn, repeats: int, before=None) -> float:
    """Median seconds of ``repeats`` calls of ``fn``; ``before`` (untimed) runs ahead of each,
    e.g. to clear a memo so that every run starts cold."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
