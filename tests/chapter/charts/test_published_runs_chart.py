"""The published-runs figure draws the table it is given: a point per run at (published,
predicted) tokens per second, the parity line, the 20 % band, the runs outside it named."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from zerolib.chapter.charts.published_runs import published_runs_figure
from zerolib.chapter.style import render_png
from zerolib.crosscheck import trained

TABLE = pd.DataFrame({
    "run": ["a", "b", "c"], "device": ["a100-80gb", "a100-80gb", "h100-80gb"],
    "convention": ["eq3", "korthikanti", "tokens"],
    "published_tokens": [100.0, 1000.0, 2000.0], "predicted_tokens": [105.0, 700.0, 2100.0],
    "ratio": [1.05, 0.7, 1.05]})


def test_the_figure_draws_the_table():
    figure, artists = published_runs_figure(TABLE)
    a100 = artists.points["a100-80gb"].get_offsets()
    assert np.allclose(a100, [[100, 105], [1000, 700]])
    assert np.allclose(artists.points["h100-80gb"].get_offsets(), [[2000, 2100]])
    # Only "b" is outside 20 % (700 / 1000 = 0.70): it is named with its ratio.
    assert set(artists.names) == {"b"} and artists.names["b"].get_text() == "b (0.70)"
    assert any("2 of 3 runs within 20%; median predicted / published 1.05" in t.get_text()
               for t in artists.ax.texts)
    assert render_png(figure) == render_png(published_runs_figure(TABLE)[0])


def test_the_figure_checks_its_table():
    with pytest.raises(ValueError, match="lacks the columns ratio"):
        published_runs_figure(TABLE.drop(columns=["ratio"]))
    with pytest.raises(TypeError, match="DataFrame"):
        published_runs_figure([1, 2])


def test_the_published_table_draws():
    table = trained.throughput_table()
    assert len(table) == len(trained.load()) >= 15
    figure, artists = published_runs_figure(table)
    outside = {run for run, ratio in zip(table["run"], table["ratio"]) if abs(ratio - 1) > 0.2}
    assert set(artists.names) == outside
