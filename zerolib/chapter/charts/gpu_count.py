"""Figure: per-GPU model state against the number of data-parallel GPUs, one line per stage.

:func:`draw_memory_vs_gpu_count` draws a :func:`zerolib.core.tables.memory_table` of one model
size into an Axes and returns the artists; :func:`update_memory_vs_gpu_count` changes the same
artists (line data, end labels, the device line, titles, axis limits) for a new table, device
or unit. The published figure, the notebooks and the explorer all draw through these.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator
from matplotlib.transforms import offset_copy

from zerolib.chapter.charts.tidy import (
    check_tidy,
    single_value,
    stages_of,
    totals_by_stage,
)
from zerolib.chapter.style import (
    DEVICE_COLOR,
    STRATEGY_COLORS,
    STRATEGY_MARKERS,
    add_axes,
    device_label,
    fix_axis_labels,
    layout_summary,
    legend_below,
    make_titles,
    new_figure,
    plain_number,
    show_device_and_titles,
    style,
)
from zerolib.core.accounting import STRATEGY_NAMES
from zerolib.core.devices import Device, get_device
from zerolib.core.tables import COLUMNS
from zerolib.core.units import check_unit, format_count, format_value

FIGSIZE = (8.0, 5.6)  # inches: every rendering has the same pixels and text size
# Margins (inches; left, right, bottom, top): the two-line title, the axis labels, the legend
# below the axes, the value labels right of the lines.
MARGINS = (0.95, 0.95, 1.4, 0.8)


def _check(table) -> pd.DataFrame:
    return check_tidy(table, COLUMNS, ("layout",), "zerolib.core.tables.memory_table")


@dataclass(eq=False)
class GpuCountArtists:
    """What :func:`draw_memory_vs_gpu_count` drew; :func:`update_memory_vs_gpu_count` changes it."""

    ax: object
    stages: tuple[int, ...]
    lines: dict                 # stage -> Line2D
    end_labels: dict            # stage -> Text: the value at the largest GPU count
    device_line: object         # Line2D at the capacity
    legend: object
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(self.stages)]


def _gpu_count_titles(params: int, gpus, layout) -> tuple[str, str]:
    span = f"{gpus[0]:,} GPU" if len(gpus) == 1 else f"{gpus[0]:,} to {gpus[-1]:,} GPUs"
    return (f"Per-GPU model state of a {format_count(params)}-parameter model on {span}",
            layout_summary(layout))


def _power_of_two_ticks(low: int, high: int) -> list[int]:
    ticks = [2**k for k in range(0, 25) if low <= 2**k <= high]
    return ticks if len(ticks) >= 2 else sorted({low, high})


def _marker_positions(gpus) -> list[int]:
    if len(gpus) <= 16:
        return list(range(len(gpus)))
    return [i for i, n in enumerate(gpus) if n & (n - 1) == 0] or [0, len(gpus) - 1]


def _spread(values, gap: float) -> list[float]:
    """Label heights: each value, pushed apart so neighbours are at least ``gap`` apart."""
    order = np.argsort(values, kind="stable")
    placed = np.array(values, dtype=float)
    previous = -np.inf
    for i in order:
        placed[i] = max(placed[i], previous + gap)
        previous = placed[i]
    return list(placed)


def _apply_gpu_count(artists: GpuCountArtists, table, device, unit):
    ax = artists.ax
    params = single_value(table, "params", "GPU-count")
    if stages_of(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    gpus, values = totals_by_stage(table, "gpus", unit)
    device = get_device(device)
    capacity = device.capacity / check_unit(unit)

    markers = _marker_positions(gpus)
    for stage, line in artists.lines.items():
        line.set_data(gpus, values[stage])
        line.set_markevery(markers)

    # x axis: powers of two on a log scale when the range is wide (the first doublings matter
    # most), plain integers otherwise.
    low, high = int(gpus[0]), int(gpus[-1])
    log_x = high >= 8 * low
    if log_x != (ax.get_xscale() == "log"):
        if log_x:
            ax.set_xscale("log", base=2)
        else:
            ax.set_xscale("linear")
    if log_x:
        ax.xaxis.set_major_locator(FixedLocator(_power_of_two_ticks(low, high)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(low / 2**0.15, high * 2**0.15)
    else:
        if high - low <= 8:
            ax.xaxis.set_major_locator(FixedLocator(range(low, high + 1)))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
        pad = max(0.3, 0.03 * (high - low))
        ax.set_xlim(low - pad, high + pad)
    ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
    ax.set_xlabel("Data-parallel GPUs" + (" (log scale)" if log_x else ""))

    top = max(max(float(v.max()) for v in values.values()), capacity) * 1.1
    ax.set_ylim(0, top)
    ax.set_ylabel(f"Model state per GPU [{unit}]")

    last = {stage: float(values[stage][-1]) for stage in artists.stages}
    heights = _spread([last[s] for s in artists.stages], gap=0.045 * top)
    for stage, height in zip(artists.stages, heights):
        label = artists.end_labels[stage]
        label.set_position((high, height))
        label.set_text(f"{format_value(last[stage])} {unit}")

    show_device_and_titles(artists, device, unit, capacity,
                            _gpu_count_titles(params, gpus, table.attrs['layout']))


def draw_memory_vs_gpu_count(ax, table: pd.DataFrame, device: str | Device = "a100-80gb",
                             unit: str = "GB") -> GpuCountArtists:
    """Per-GPU model state against GPU count: one line per stage, the device's capacity dashed.

    ``table`` holds one model size (:func:`zerolib.core.tables.memory_table`, whose ``attrs`` name the layout).
    """
    table = _check(table)
    single_value(table, "params", "GPU-count")
    check_unit(unit)
    stages = stages_of(table)
    with style():
        lines = {}
        for stage in stages:
            (lines[stage],) = ax.plot([], [], color=STRATEGY_COLORS[stage], lw=2.2,
                                      marker=STRATEGY_MARKERS[stage], ms=5.5,
                                      label=STRATEGY_NAMES[stage], clip_on=False, zorder=3)
        device_line = ax.axhline(0, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=2,
                                 label=device_label(device, unit))
        label_offset = offset_copy(ax.transData, ax.figure, x=8, units="points")
        end_labels = {stage: ax.text(0, 0, "", transform=label_offset, ha="left", va="center",
                                     fontsize=10, color=STRATEGY_COLORS[stage], fontweight="bold",
                                     clip_on=False)
                      for stage in stages}
        legend = legend_below(ax, [*lines.values(), device_line], ncol=2)
        title, subtitle = make_titles(ax, "", "")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", length=0)       # the grid lines mark the values
        ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        fix_axis_labels(ax)
        artists = GpuCountArtists(ax, stages, lines, end_labels, device_line, legend, title,
                                  subtitle)
        _apply_gpu_count(artists, table, device, unit)
    return artists


def update_memory_vs_gpu_count(artists: GpuCountArtists, table: pd.DataFrame,
                               device: str | Device = "a100-80gb", unit: str = "GB") -> GpuCountArtists:
    """Redraw the same artists for a new table, device or unit (nothing is re-created)."""
    table = _check(table)
    with style():
        _apply_gpu_count(artists, table, device, unit)
    return artists


def gpu_count_figure(table: pd.DataFrame, device: str | Device = "a100-80gb", unit: str = "GB",
                     dpi: float = 100) -> tuple[Figure, GpuCountArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_memory_vs_gpu_count` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_memory_vs_gpu_count(add_axes(figure, MARGINS), table, device, unit)
    return figure, artists
