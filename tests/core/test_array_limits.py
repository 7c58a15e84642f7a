"""Issue 24, item 11: array arguments are limited to what one call finishes in seconds, and an
oversized broadcast is refused before any array of that shape is built."""
from __future__ import annotations

import time

import numpy as np
import pytest

import zerolib as zl
from zerolib.chapter.figures import FigureOptions
from zerolib.core.inputs import MAX_ARRAY_SIZE, MAX_FIGURE_SIZES


def test_the_limits():
    assert MAX_ARRAY_SIZE == 10**7 and MAX_FIGURE_SIZES == 64


def test_more_values_than_the_limit_are_refused_by_name():
    params = np.ones(MAX_ARRAY_SIZE + 1, dtype=np.int64)
    with pytest.raises(ValueError, match=r"^params, gpus, stage broadcast to 10,000,001 values, "
                                         r"more than 10,000,000 per call"):
        zl.model_state(params, 8, 3)


def test_a_broadcast_beyond_the_limit_is_refused_at_once():
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"^params, gpus, stage broadcast to 100,000,000 values"):
        zl.model_state(np.ones((10**4, 1), dtype=np.int64), np.ones((1, 10**4), dtype=np.int64), 3)
    assert time.perf_counter() - started < 2


def test_the_limit_itself_is_accepted():
    state = zl.model_state(np.full(MAX_ARRAY_SIZE, 10**9, dtype=np.int64), 8, 3)
    # Stage 3 over 8: 16 bytes x 10**9 / 8 = 2 x 10**9 bytes on each worker.
    assert int(state.total[0]) == 2 * 10**9 and int(state.total[-1]) == 2 * 10**9


def test_figure_options_hold_at_most_64_model_sizes():
    FigureOptions(model_sizes=tuple(range(1, 65)))
    with pytest.raises(ValueError, match="^model_sizes must hold at most 64 values"):
        FigureOptions(model_sizes=tuple(range(1, 66)))
