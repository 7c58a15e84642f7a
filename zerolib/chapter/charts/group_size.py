"""Figure: per-GPU model state against the shard-group size G, for a fixed number of GPUs.

:func:`draw_group_size` draws a :func:`zerolib.core.tables.group_size_table` (one model, one GPU
count N, every divisor G of N) into an Axes, one line per stage, and returns the artists;
:func:`update_group_size` changes the same artists for a new table, device or unit. G = 1 is
plain data parallelism whatever the stage, G = N the ZeRO of the earlier figures; in between,
the state is sharded over G GPUs and replicated over N / G groups (HSDP, MiCS).

The traffic side of this trade (the collectives inside a group on the node's fast link, the
gradient all-reduce across the groups on the network) is drawn beside it by
:mod:`zerolib.chapter.charts.group_traffic`, whose figure puts this panel on top.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator
from matplotlib.transforms import offset_copy

from zerolib.chapter.charts.gpu_count import _spread as spread_labels
from zerolib.chapter.charts.offload_tiers import params_words
from zerolib.chapter.charts.tidy import check_tidy, single_value, stages_of, totals_by_stage
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
from zerolib.core.tables import GROUP_COLUMNS
from zerolib.core.units import check_unit, format_value

FIGSIZE = (8.0, 5.6)
MARGINS = (0.95, 0.95, 1.4, 0.8)
MAX_TICKS = 13   # label every G up to this many; powers of two beyond


def _check(table) -> pd.DataFrame:
    return check_tidy(table, GROUP_COLUMNS, ("layout",), "zerolib.core.tables.group_size_table")


@dataclass(eq=False)
class GroupSizeArtists:
    """What :func:`draw_group_size` drew; :func:`update_group_size` changes it."""

    ax: object
    stages: tuple[int, ...]
    lines: dict
    end_labels: dict
    device_line: object
    legend: object
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(self.stages)]


def group_size_titles(params: int, gpus: int, layout) -> tuple[str, str]:
    return (f"{params_words(params)} parameters on {gpus:,} GPUs: model state per GPU by shard group",
            layout_summary(layout))


def set_group_axis(ax, groups, gpus: int) -> int:
    """The x axis of every group-size panel: G on a log-2 scale, each G (or each power of two)
    labelled; returns the largest G."""
    low, high = int(groups[0]), int(groups[-1])
    if high > low:
        ax.set_xscale("log", base=2)
        ticks = ([int(g) for g in groups] if len(groups) <= MAX_TICKS else
                 [int(g) for g in groups if int(g) & (int(g) - 1) == 0])
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(low / 2**0.25, high * 2**0.25)
    else:
        ax.set_xscale("linear")
        ax.xaxis.set_major_locator(FixedLocator([low]))
        ax.set_xlim(low - 1, high + 1)
    ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
    ax.set_xlabel(f"Shard group size G (log scale): sharded over G, {gpus:,} / G replicas")
    return high


def _apply(artists: GroupSizeArtists, table, device, unit):
    ax = artists.ax
    params = single_value(table, "params", "group-size")
    gpus = single_value(table, "gpus", "group-size")
    if stages_of(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    groups, values = totals_by_stage(table, "shard_group", unit)
    device = get_device(device)
    capacity = device.capacity / check_unit(unit)
    for stage, line in artists.lines.items():
        line.set_data(groups, values[stage])
    high = set_group_axis(ax, groups, gpus)
    top = max(max(float(v.max()) for v in values.values()), capacity) * 1.1
    ax.set_ylim(0, top)
    ax.set_ylabel(f"Model state per GPU [{unit}]")
    last = {stage: float(values[stage][-1]) for stage in artists.stages}
    heights = spread_labels([last[s] for s in artists.stages], gap=0.045 * top)
    for stage, height in zip(artists.stages, heights):
        artists.end_labels[stage].set_position((high, height))
        artists.end_labels[stage].set_text(f"{format_value(last[stage])} {unit}")
    show_device_and_titles(artists, device, unit, capacity,
                           group_size_titles(params, gpus, table.attrs["layout"]))


def draw_group_size(ax, table: pd.DataFrame, device: str | Device = "a100-80gb",
                    unit: str = "GB") -> GroupSizeArtists:
    """Per-GPU model state against the shard group G: one line per stage, the device dashed."""
    table = _check(table)
    check_unit(unit)
    stages = stages_of(table)
    with style():
        lines = {}
        for stage in stages:
            (lines[stage],) = ax.plot([], [], color=STRATEGY_COLORS[stage], lw=2.2,
                                      marker=STRATEGY_MARKERS[stage], ms=6,
                                      label=STRATEGY_NAMES[stage], clip_on=False, zorder=3)
        device_line = ax.axhline(0, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=2,
                                 label=device_label(device, unit))
        label_offset = offset_copy(ax.transData, ax.figure, x=10, units="points")
        end_labels = {stage: ax.text(0, 0, "", transform=label_offset, ha="left", va="center",
                                     fontsize=10, color=STRATEGY_COLORS[stage], fontweight="bold",
                                     clip_on=False) for stage in stages}
        legend = legend_below(ax, [*lines.values(), device_line], ncol=2)
        title, subtitle = make_titles(ax, "", "")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", length=0)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        fix_axis_labels(ax)
        artists = GroupSizeArtists(ax, stages, lines, end_labels, device_line, legend, title,
                                   subtitle)
        _apply(artists, table, device, unit)
    return artists


def update_group_size(artists: GroupSizeArtists, table: pd.DataFrame,
                      device: str | Device = "a100-80gb", unit: str = "GB") -> GroupSizeArtists:
    """Redraw the same artists for a new table, device or unit."""
    table = _check(table)
    with style():
        _apply(artists, table, device, unit)
    return artists


def group_size_figure(table: pd.DataFrame, device: str | Device = "a100-80gb", unit: str = "GB",
                      dpi: float = 100) -> tuple[Figure, GroupSizeArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_group_size` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_group_size(add_axes(figure, MARGINS), table, device, unit)
    return figure, artists

