"""Figure: bytes measured on each rank of a real sharded run beside zerolib's prediction.

Draws the tables of :func:`zerolib.crosscheck.validation.report.rank_bars` (one panel per
strategy and moment; per category a bar per rank, a dashed line at the prediction, and the
relative difference above each bar). It reads the table's columns only, so it needs nothing
from the cross-checks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import offset_copy

from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.style import (
    LABEL_BACKING,
    OKABE_ITO,
    STRATEGY_COLORS,
    new_figure,
    style,
)
from zerolib.core.memory.accounting import CATEGORIES, STRATEGY_NAMES
from zerolib.core.units import format_relative

MEASURED_COLUMNS = ("panel", "stage", "rank", "category", "measured_bytes", "predicted_bytes",
                    "relative_difference")
PREDICTION_COLOR = OKABE_ITO["black"]
# Inches: each panel's axes, and the fixed margins around and between them.
_MEASURED_PANEL = (4.7, 2.45)
_MEASURED_MARGINS = {"left": 0.95, "right": 0.25, "between": 1.0, "top": 0.95, "title": 0.62,
                     "below": 0.62, "legend": 0.6}
_RELATIVE_LABEL_SIZE = 8  # points


@dataclass(eq=False)
class MeasuredArtists:
    """What :func:`draw_measured_vs_predicted` drew in one panel."""

    ax: object
    categories: tuple[str, ...]
    ranks: tuple[int, ...]
    bars: dict              # category -> BarContainer (one bar per rank)
    predictions: dict       # category -> LineCollection across the category's bars
    difference_labels: dict  # category -> [Text above each bar]
    title: object


def _check_measured(table) -> pd.DataFrame:
    check_tidy(table, MEASURED_COLUMNS, (), "zerolib.crosscheck.validation.report.rank_bars")
    unknown = sorted(set(table["category"]) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"table's category must be one of {', '.join(CATEGORIES)}, got {unknown}")
    for panel, group in table.groupby("panel", sort=False):
        if group["stage"].nunique() != 1 or int(group["stage"].iloc[0]) not in STRATEGY_COLORS:
            raise ValueError(f"panel {panel!r} must hold one stage from 0 to 3")
        if group.duplicated(["category", "rank"]).any():
            raise ValueError(f"panel {panel!r} holds a rank twice in one category")
        if (group.groupby("category")["predicted_bytes"].nunique() != 1).any():
            raise ValueError(f"panel {panel!r}: zerolib predicts the same bytes for every rank; "
                             "predicted_bytes must not differ between ranks of a category")
    return table


def draw_measured_vs_predicted(ax, table: pd.DataFrame, y_max: float | None = None) -> MeasuredArtists:
    """One panel: per category a group of bars, the bytes each rank measured (the stage's
    colour), a dashed black line across the group at zerolib's prediction, and above each bar
    its difference from the prediction. ``table`` holds one panel of
    :func:`zerolib.crosscheck.validation.report.rank_bars`; ``y_max`` fixes the top of the y axis (bytes).
    """
    table = _check_measured(table)
    if table["panel"].nunique() != 1:
        raise ValueError("table must hold one panel here; measured_vs_predicted_figure draws several")
    stage = int(table["stage"].iloc[0])
    categories = tuple(c for c in CATEGORIES if c in set(table["category"]))
    ranks = tuple(int(r) for r in sorted(table["rank"].unique()))
    width = 0.8 / len(ranks)
    offsets = (np.arange(len(ranks)) - (len(ranks) - 1) / 2) * width
    above = offset_copy(ax.transData, ax.figure, y=2, units="points")
    artists = MeasuredArtists(ax, categories, ranks, {}, {}, {}, None)
    with style():
        ticks, tick_labels = [], []
        for i, category in enumerate(categories):
            rows = table[table["category"] == category].set_index("rank").reindex(ranks)
            x = i + offsets
            measured = rows["measured_bytes"].to_numpy(dtype=float)
            artists.bars[category] = ax.bar(x, measured, width * 0.88, color=STRATEGY_COLORS[stage],
                                            edgecolor="white", linewidth=0.6, zorder=3)
            predicted = float(rows["predicted_bytes"].dropna().iloc[0])
            artists.predictions[category] = ax.hlines(predicted, i - 0.46, i + 0.46,
                                                      color=PREDICTION_COLOR, lw=1.8,
                                                      ls=(0, (4, 2)), zorder=4)
            artists.difference_labels[category] = [
                ax.text(xj, hj, format_relative(float(rel)), transform=above, rotation=90,
                        ha="center", va="bottom", fontsize=_RELATIVE_LABEL_SIZE, color="#222222",
                        zorder=5, bbox=dict(LABEL_BACKING))
                for xj, hj, rel in zip(x, measured, rows["relative_difference"])]
            ticks += list(x)
            tick_labels += [str(r) for r in ranks]
            # The category under its group, below the rank numbers.
            ax.text(i, 0, category, transform=offset_copy(ax.get_xaxis_transform(), ax.figure,
                                                          y=-16, units="points"),
                    ha="center", va="top", fontsize=10)
        ax.set_xticks(ticks, tick_labels, fontsize=8)
        ax.tick_params(axis="x", length=0, pad=2)
        ax.set_xlim(-0.55, len(categories) - 0.45)
        top = y_max if y_max is not None else _measured_top(table)
        ax.set_ylim(0, top)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.set_ylabel("Bytes on one rank")
        ax.text(-0.55, 0, "rank", transform=offset_copy(ax.get_xaxis_transform(), ax.figure,
                                                          y=-2, units="points"),
                ha="right", va="top", fontsize=8, color="#555555")
        # A panel title may have two lines (what ran, then when it was measured).
        artists.title = ax.set_title(str(table["panel"].iloc[0]), loc="left", fontsize=10.5,
                                     fontweight="bold", pad=6, linespacing=1.3)
    return artists


def _measured_top(table: pd.DataFrame) -> float:
    # Room above the tallest bar for its rotated difference label (about a third of the axes).
    return 1.35 * float(max(table["measured_bytes"].max(), table["predicted_bytes"].max()))


def measured_vs_predicted_figure(table: pd.DataFrame, title: str, subtitle: str = "",
                                 ncols: int = 2, dpi: float = 100) -> tuple[Figure, list]:
    """All panels of a :func:`zerolib.crosscheck.validation.report.rank_bars` table on one shared y axis,
    ``ncols`` to a row, in the table's order, with the title, the subtitle and one legend."""
    table = _check_measured(table)
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be a positive whole number, got {ncols!r}")
    panels = list(pd.unique(table["panel"]))
    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    m, (panel_w, panel_h) = _MEASURED_MARGINS, _MEASURED_PANEL
    row_h = m["title"] + panel_h + m["below"]
    width = m["left"] + ncols * panel_w + (ncols - 1) * m["between"] + m["right"]
    height = m["top"] + nrows * row_h + m["legend"]
    figure = new_figure((width, height), dpi)
    top = _measured_top(table)
    drawn = []
    for index, panel in enumerate(panels):
        row, col = divmod(index, ncols)
        left = m["left"] + col * (panel_w + m["between"])
        bottom = height - m["top"] - row * row_h - m["title"] - panel_h
        with style():
            ax = figure.add_axes((left / width, bottom / height, panel_w / width, panel_h / height))
        drawn.append(draw_measured_vs_predicted(ax, table[table["panel"] == panel], y_max=top))
    with style():
        figure.text(m["left"] / width, 1 - 0.18 / height, title, ha="left", va="top",
                    fontsize=12.5, fontweight="bold")
        if subtitle:
            figure.text(m["left"] / width, 1 - 0.48 / height, subtitle, ha="left", va="top",
                        fontsize=10, color="#333333")
        handles, labels = [], []
        for artists in drawn:
            stage = int(table.loc[table["panel"] == artists.title.get_text(), "stage"].iloc[0])
            label = f"measured on each rank, vs {STRATEGY_NAMES[stage]}"
            if label not in labels:
                handles.append(next(iter(artists.bars.values())))
                labels.append(label)
        handles.append(next(iter(drawn[0].predictions.values())))
        labels.append("zerolib's prediction (the same for every rank)")
        figure.legend(handles, labels, loc="lower left", bbox_to_anchor=(m["left"] / width, 0.02),
                      ncol=2, frameon=False, fontsize=9, handlelength=2.2, columnspacing=1.6)
    return figure, drawn

