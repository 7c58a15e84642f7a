"""Figure: zerolib's predicted throughput against what published training runs measured.

Draws the table of :func:`zerolib.crosscheck.trained.throughput_table` (one row per run: its
device, its source's FLOP convention, the published and the predicted tokens per GPU and
second). Tokens per second need no FLOP convention: each source's TFLOP/s or MFU was turned
into tokens with its own count (``docs/flops.md``) before it reached this table. One point per
run on log axes, the line where prediction equals measurement and the band 20 % either side;
the runs outside the band are named. It reads the table's columns only, so it needs nothing
from the cross-checks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.style import OKABE_ITO, add_axes, legend_below, make_titles, new_figure, style

PUBLISHED_RUNS_COLUMNS = ("run", "device", "convention", "published_tokens", "predicted_tokens",
                          "ratio")
BAND = 0.2                      # the stated agreement: within 20 %
FIGSIZE = (8.2, 6.6)            # inches
MARGINS = (1.0, 0.4, 1.3, 0.9)  # left, right, bottom (legend), top
DEVICE_COLORS = {"a100-80gb": OKABE_ITO["blue"], "h100-80gb": OKABE_ITO["vermillion"]}
OTHER_COLOR = OKABE_ITO["reddish purple"]


@dataclass(eq=False)
class PublishedRunsArtists:
    """What :func:`published_runs_figure` drew."""

    ax: object
    points: dict        # device -> PathCollection, one point per run of that device
    parity: object      # the line predicted = published
    band: object        # the 20 % band
    names: dict         # run -> Text, for the runs outside the band


def check_published_runs(table) -> pd.DataFrame:
    """``table`` if it is :func:`zerolib.crosscheck.trained.throughput_table`'s shape."""
    check_tidy(table, PUBLISHED_RUNS_COLUMNS, (), "zerolib.crosscheck.trained.throughput_table")
    if not ((table["published_tokens"] > 0) & (table["predicted_tokens"] > 0)).all():
        raise ValueError("table's published_tokens and predicted_tokens must be positive")
    return table


def published_runs_figure(table) -> tuple[Figure, PublishedRunsArtists]:
    """Predicted against published tokens per GPU and second, one point per run (see the module
    doc). Returns the figure and its artists."""
    table = check_published_runs(table)
    figure = new_figure(FIGSIZE)
    ax = add_axes(figure, MARGINS)
    published = table["published_tokens"].to_numpy(dtype=float)
    predicted = table["predicted_tokens"].to_numpy(dtype=float)
    low = 10 ** np.floor(np.log10(min(published.min(), predicted.min()) / (1 + BAND)))
    high = 10 ** np.ceil(np.log10(max(published.max(), predicted.max()) * (1 + BAND)))
    with style():
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        span = np.array([low, high])
        band = ax.fill_between(span, span * (1 - BAND), span * (1 + BAND), color="#dddddd",
                               linewidth=0, zorder=1)
        (parity,) = ax.plot(span, span, color="#555555", linewidth=1.0, zorder=2)
        points, names = {}, {}
        for device in dict.fromkeys(table["device"]):
            mine = table[table["device"] == device]
            points[device] = ax.scatter(mine["published_tokens"], mine["predicted_tokens"], s=36,
                                        color=DEVICE_COLORS.get(device, OTHER_COLOR),
                                        edgecolor="white", linewidth=0.6, zorder=3)
        outside = table[(table["ratio"] - 1).abs() > BAND]
        for row in outside.itertuples():
            names[row.run] = ax.annotate(f"{row.run} ({row.ratio:.2f})",
                                         (row.published_tokens, row.predicted_tokens),
                                         xytext=(6, -4), textcoords="offset points", fontsize=8,
                                         color="#333333", zorder=4)
        ax.set_xlabel("Published [tokens per GPU and second, in the source's own FLOP convention]")
        ax.set_ylabel("zerolib's prediction [tokens per GPU and second]")
        within = int(((table["ratio"] - 1).abs() <= BAND).sum())
        make_titles(ax, "zerolib's step model against published training runs",
                    f"{within} of {len(table)} runs within {BAND:.0%}; median predicted / published "
                    f"{float(table['ratio'].median()):.2f}")
        handles = [Line2D([], [], marker="o", linestyle="", color=DEVICE_COLORS.get(d, OTHER_COLOR),
                          label=d) for d in points]
        handles.append(Line2D([], [], color="#555555", label="predicted = published"))
        handles.append(Line2D([], [], color="#dddddd", linewidth=8, label=f"within {BAND:.0%}"))
        legend_below(ax, handles, ncol=len(handles))
    return figure, PublishedRunsArtists(ax, points, parity, band, names)
