"""Whole-number helpers shared by the arithmetic: ceiling division and monotone searches.

The searches ("fewest GPUs", "largest model", "largest micro-batch") are bisections over a
predicate that switches once: vectorised over numpy arrays (a 0-d array is one search), they
take about log2(high - low) calls of the predicate, each on every element at once.
"""
from __future__ import annotations

import numpy as np


def ceil_div(numerator, denominator):
    """ceil(numerator / denominator) for whole numbers (Python ints or int64 arrays), exactly."""
    return -(-numerator // denominator)


def exact_product(values, counts):
    """``values * counts`` elementwise, exactly: int64 where every product fits (checked, not
    assumed), otherwise an object array of Python ints (10**15 bytes on 2**24 workers exceed
    int64)."""
    values, counts = np.asarray(values), np.asarray(counts)
    if np.all(np.abs(values) <= np.iinfo(np.int64).max // np.maximum(np.abs(counts), 1)):
        return values * counts
    # Python ints elementwise; a 0-d product comes back as a bare int: keep it an array.
    return np.asarray(values.astype(object) * counts.astype(object), dtype=object)


def first_true(ok, low, high) -> np.ndarray:
    """Smallest x in [low, high] with ``ok(x)``, where ``ok`` is False below some point and True
    from it on; ``high + 1`` where ``ok(high)`` is False. Elementwise over broadcast arrays."""
    low, high = (np.asarray(a, dtype=np.int64) for a in np.broadcast_arrays(low, high))
    found, top = ok(high), high
    low, high = low.copy(), high.copy()
    while np.any(low < high):
        mid = low + (high - low) // 2
        good = ok(mid)
        high = np.where(good, mid, high)
        low = np.where(good, low, mid + 1)
    return np.where(found, low, top + 1)


def last_true(ok, low, high) -> np.ndarray:
    """Largest x in [low, high] with ``ok(x)``, where ``ok`` is True up to some point and False
    after it; ``low - 1`` where ``ok(low)`` is False. Elementwise over broadcast arrays."""
    low, high = (np.asarray(a, dtype=np.int64) for a in np.broadcast_arrays(low, high))
    found, bottom = ok(low), low
    low, high = low.copy(), high.copy()
    while np.any(low < high):
        mid = low + (high - low + 1) // 2
        good = ok(mid)
        low = np.where(good, mid, low)
        high = np.where(good, high, mid - 1)
    return np.where(found, low, bottom - 1)
