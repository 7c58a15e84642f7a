"""Figure: per-GPU model state against the shard-group size G, for a fixed number of GPUs.

:func:`draw_group_size` draws a :func:`zerolib.core.memory.tables.group_size_table` (one model, one GPU
count N, every divisor G of N) into an Axes, one line per stage, and returns the artists;
:func:`update_group_size` changes the same artists for a new table, device or unit. G = 1 is
plain data parallelism whatever the stage, G = N the ZeRO of the earlier figures; in between,
the state is sharded over G GPUs and replicated over N / G groups (HSDP, MiCS).

The traffic side of this trade (the collectives inside a group on the node's fast link, the
gradient all-reduce across the groups on the network) is drawn beside it by
:mod:`zerolib.chapter.charts.group_traffic`, whose figure puts this panel on top.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from zerolib.chapter.charts.offload_tiers import params_words
from zerolib.chapter.charts.stage_lines import StageLineArtists, draw_stage_lines, show_stage_lines
from zerolib.chapter.charts.tidy import check_tidy, single_value, stages_of, totals_by_stage
from zerolib.chapter.style import (
    add_axes,
    gpus_text,
    layout_summary,
    new_figure,
    plain_number,
    show_device_and_titles,
    style,
)
from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.tables import GROUP_COLUMNS
from zerolib.core.units import check_unit

FIGSIZE = (8.0, 5.6)
MARGINS = (0.95, 0.95, 1.4, 0.8)
MAX_TICKS = 13   # label every G up to this many; powers of two beyond


def _check(table) -> pd.DataFrame:
    return check_tidy(table, GROUP_COLUMNS, ("layout",), "zerolib.core.memory.tables.group_size_table")


# What :func:`draw_group_size` drew; :func:`update_group_size` changes it.
GroupSizeArtists = StageLineArtists


def group_size_titles(params: int, gpus: int, layout) -> tuple[str, str]:
    return (f"{params_words(params)} parameters on {gpus_text(gpus)}: model state per GPU by shard group",
            layout_summary(layout))


def set_group_axis(ax, groups, gpus: int) -> None:
    """The x axis of every group-size panel: G on a log-2 scale, each G (or each power of two)
    labelled."""
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


def _apply(artists: GroupSizeArtists, table, device, unit):
    ax = artists.ax
    params = single_value(table, "params", "group-size")
    gpus = single_value(table, "gpus", "group-size")
    if stages_of(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    groups, values = totals_by_stage(table, "shard_group", unit)
    device = get_device(device)
    capacity = device.capacity / check_unit(unit)
    show_stage_lines(artists, groups, values, unit, capacity)
    set_group_axis(ax, groups, gpus)
    show_device_and_titles(artists, device, unit, capacity,
                           group_size_titles(params, gpus, table.attrs["layout"]))


def draw_group_size(ax, table: pd.DataFrame, device: str | Device = "a100-80gb",
                    unit: str = "GB") -> GroupSizeArtists:
    """Per-GPU model state against the shard group G: one line per stage, the device dashed."""
    table = _check(table)
    check_unit(unit)
    stages = stages_of(table)
    with style():
        artists = draw_stage_lines(ax, stages, device, unit)
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

