"""Figure: per-GPU model state against the number of data-parallel GPUs, one line per stage.

:func:`draw_memory_vs_gpu_count` draws a :func:`zerolib.core.memory.tables.memory_table` of one model
size into an Axes and returns the artists; :func:`update_memory_vs_gpu_count` changes the same
artists (line data, end labels, the device line, titles, axis limits) for a new table, device
or unit. The published figure, the notebooks and the explorer all draw through these.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from zerolib.chapter.charts.stage_lines import StageLineArtists, draw_stage_lines, show_stage_lines
from zerolib.chapter.charts.tidy import check_tidy, single_value, stages_of, totals_by_stage
from zerolib.chapter.style import (
    a_or_an,
    add_axes,
    gpus_text,
    layout_summary,
    new_figure,
    plain_number,
    show_device_and_titles,
    style,
)
from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.tables import COLUMNS
from zerolib.core.units import check_unit, format_count

FIGSIZE = (8.0, 5.6)  # inches: every rendering has the same pixels and text size
# Margins (inches; left, right, bottom, top): the two-line title, the axis labels, the legend
# below the axes, the value labels right of the lines.
MARGINS = (0.95, 0.95, 1.4, 0.8)


def _check(table) -> pd.DataFrame:
    return check_tidy(table, COLUMNS, ("layout",), "zerolib.core.memory.tables.memory_table")


# What :func:`draw_memory_vs_gpu_count` drew; :func:`update_memory_vs_gpu_count` changes it.
GpuCountArtists = StageLineArtists


def _gpu_count_titles(params: int, gpus, layout) -> tuple[str, str]:
    span = gpus_text(gpus[0]) if len(gpus) == 1 else f"{gpus[0]:,} to {gpus[-1]:,} GPUs"
    return (f"Per-GPU model state of {a_or_an(format_count(params))}-parameter model on {span}",
            layout_summary(layout))


def _power_of_two_ticks(low: int, high: int) -> list[int]:
    ticks = [2**k for k in range(0, 25) if low <= 2**k <= high]
    return ticks if len(ticks) >= 2 else sorted({low, high})


def _marker_positions(gpus) -> list[int]:
    if len(gpus) <= 16:
        return list(range(len(gpus)))
    return [i for i, n in enumerate(gpus) if n & (n - 1) == 0] or [0, len(gpus) - 1]


def _apply_gpu_count(artists: GpuCountArtists, table, device, unit):
    ax = artists.ax
    params = single_value(table, "params", "GPU-count")
    if stages_of(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    gpus, values = totals_by_stage(table, "gpus", unit)
    device = get_device(device)
    capacity = device.capacity / check_unit(unit)

    show_stage_lines(artists, gpus, values, unit, capacity)
    markers = _marker_positions(gpus)
    for line in artists.lines.values():
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

    show_device_and_titles(artists, device, unit, capacity,
                            _gpu_count_titles(params, gpus, table.attrs['layout']))


def draw_memory_vs_gpu_count(ax, table: pd.DataFrame, device: str | Device = "a100-80gb",
                             unit: str = "GB") -> GpuCountArtists:
    """Per-GPU model state against GPU count: one line per stage, the device's capacity dashed.

    ``table`` holds one model size (:func:`zerolib.core.memory.tables.memory_table`, whose ``attrs`` name the layout).
    """
    table = _check(table)
    single_value(table, "params", "GPU-count")
    check_unit(unit)
    stages = stages_of(table)
    with style():
        artists = draw_stage_lines(ax, stages, device, unit)
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
