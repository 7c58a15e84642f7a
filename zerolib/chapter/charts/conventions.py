"""Figure: one setting under each system's convention, per ZeRO stage, as grouped bars.

:func:`draw_conventions` draws the tidy table of
:func:`zerolib.crosscheck.conventions.side_by_side.model_state_by_convention` (columns
convention, stage, bytes, counts; ``attrs`` model and gpus): per stage, one bar per convention
that defines that stage, with its value on top. It is drawn once (no explorer changes it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import offset_copy

from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.charts.will_it_fit import TOL_MUTED
from zerolib.chapter.style import (
    add_axes,
    fix_axis_labels,
    gpus_text,
    legend_below,
    make_titles,
    new_figure,
    plain_number,
    style,
)
from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.units import check_unit, format_value

FIGSIZE = (10.0, 6.4)
MARGINS = (0.95, 0.3, 1.9, 0.8)
COLUMNS = ("convention", "stage", "bytes", "counts")
# One colour per convention, in the table's order (Paul Tol's muted scheme).
PALETTE = (TOL_MUTED["indigo"], TOL_MUTED["rose"], TOL_MUTED["green"], TOL_MUTED["sand"],
           TOL_MUTED["cyan"], TOL_MUTED["wine"])
_GROUP_WIDTH = 0.84


@dataclass(eq=False)
class ConventionArtists:
    ax: object
    conventions: tuple[str, ...]
    bars: dict            # convention -> BarContainer (its stages only)
    value_labels: dict    # convention -> texts above its bars
    legend: object
    title: object
    subtitle: object


def draw_conventions(ax, table: pd.DataFrame, unit: str = "GB") -> ConventionArtists:
    """Grouped bars: per stage, the per-GPU model state under each convention defining it."""
    table = check_tidy(table, COLUMNS, ("model", "gpus"),
                       "zerolib.crosscheck.conventions.side_by_side.model_state_by_convention")
    if len(table["convention"].unique()) > len(PALETTE):
        raise ValueError(f"table must hold at most {len(PALETTE)} conventions")
    scale = check_unit(unit)
    conventions = tuple(pd.unique(table["convention"]))
    stages = sorted(int(s) for s in table["stage"].unique())
    slot = _GROUP_WIDTH / len(conventions)
    with style():
        bars, value_labels = {}, {}
        above = offset_copy(ax.transData, ax.figure, y=2, units="points")
        for k, (convention, colour) in enumerate(zip(conventions, PALETTE)):
            rows = table[table["convention"] == convention].sort_values("stage")
            x = (np.searchsorted(stages, rows["stage"].to_numpy())
                 - _GROUP_WIDTH / 2 + slot * (k + 0.5))
            heights = rows["bytes"].to_numpy(dtype=float) / scale
            counts = rows["counts"].iloc[0]
            bars[convention] = ax.bar(x, heights, slot * 0.92, color=colour, zorder=3,
                                      label=f"{convention}: {counts}")
            value_labels[convention] = [
                ax.text(xi, h, format_value(h), transform=above, ha="center", va="bottom",
                        fontsize=7.5, rotation=90, color="#222222")
                for xi, h in zip(x, heights)]
        top = float(table["bytes"].max()) / scale
        ax.set_ylim(0, top * 1.18)
        ax.set_xticks(range(len(stages)))
        ax.set_xticklabels([STRATEGY_NAMES[s] for s in stages], fontsize=9.5)
        ax.set_xlim(-0.55, len(stages) - 0.45)
        ax.tick_params(axis="x", length=0)
        ax.tick_params(axis="y", length=0, labelsize=10)
        ax.set_ylabel(f"Model state per GPU [{unit}]")
        ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        legend = legend_below(ax, list(bars.values()), ncol=1)
        model, gpus = table.attrs["model"], table.attrs["gpus"]
        title, subtitle = make_titles(
            ax, f"One setting, five conventions: {model.name} on {gpus_text(gpus, 'data-parallel GPU')}",
            "Each system's published arithmetic, reproduced by zerolib (bars only where a "
            "convention defines the stage)")
        fix_axis_labels(ax)
        ax.xaxis.label.set_visible(False)
    return ConventionArtists(ax, conventions, bars, value_labels, legend, title, subtitle)


def conventions_figure(table: pd.DataFrame, unit: str = "GB",
                       dpi: float = 100) -> tuple[Figure, ConventionArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_conventions` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_conventions(add_axes(figure, MARGINS), table, unit)
    return figure, artists
