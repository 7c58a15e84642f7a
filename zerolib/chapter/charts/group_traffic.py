"""Figure: the shard group's trade, per-GPU memory beside traffic and step time against G.

:func:`draw_group_traffic` draws a :func:`zerolib.core.step.tables.group_traffic_table` into
two Axes: the bytes that leave each node per step (what the network carries; the collectives
of a group inside a node add none) and the time, one colour per stage: the step (solid), all
collectives back to back (dotted: what the overlap has to hide) and the compute alone (grey).
:func:`update_group_traffic` changes the same artists for a new table or unit.
:func:`group_tradeoff_figure` stacks the model state per GPU
(:func:`zerolib.chapter.charts.group_size.draw_group_size`), the traffic and the time over one
axis of G: the one figure of the trade wherever it is shown.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

from zerolib.chapter.charts.group_size import GroupSizeArtists, draw_group_size, set_group_axis
from zerolib.chapter.charts.tidy import check_tidy, single_value, stages_of
from zerolib.chapter.style import (
    STRATEGY_COLORS,
    STRATEGY_MARKERS,
    fix_axis_labels,
    gpus_text,
    legend_below,
    make_titles,
    new_figure,
    plain_number,
    style,
)
from zerolib.core.catalogue.devices import Device
from zerolib.core.catalogue.models import parameter_count
from zerolib.core.step.engines import get_engine
from zerolib.core.step.tables import GROUP_TRAFFIC_COLUMNS
from zerolib.core.units import check_unit, format_value

# Three panels stacked over one axis of G (inches): left, right margins; each panel's height,
# the room above it for its titles and below it for its axis label (and legend).
WIDTH = 8.4
LEFT, RIGHT = 0.95, 0.95
PANEL = 2.75
ABOVE = 0.8
BELOW = (1.45, 0.62, 1.0)   # memory (its legend), traffic, time (its legend)
FIGSIZE = (WIDTH, 3 * (PANEL + ABOVE) + sum(BELOW))
COMPUTE_COLOR = "#777777"
BACK_TO_BACK = (0, (1, 1.6))


def _check(table) -> pd.DataFrame:
    return check_tidy(table, GROUP_TRAFFIC_COLUMNS, ("model", "gpus", "interconnect", "device",
                                                      "compute"),
                      "zerolib.core.step.tables.group_traffic_table")


@dataclass(eq=False)
class GroupTrafficArtists:
    """What :func:`draw_group_traffic` drew; :func:`update_group_traffic` changes it."""

    traffic_ax: object
    time_ax: object
    stages: tuple[int, ...]
    crossing: dict     # stage -> Line2D: bytes leaving a node
    step: dict         # stage -> Line2D: step time
    back_to_back: dict  # stage -> Line2D: all collectives one after another
    compute_line: object
    titles: tuple      # (traffic title, subtitle, time title, subtitle)


def _grid(table: pd.DataFrame, column: str) -> tuple[np.ndarray, dict]:
    groups = np.unique(table["shard_group"].to_numpy())
    out = {}
    for stage in stages_of(table):
        rows = table[table["stage"] == stage].sort_values("shard_group")
        if len(rows) != len(groups):
            raise ValueError("table must hold every stage exactly once at every shard group")
        out[stage] = rows[column].to_numpy(dtype=float)
    return groups, out


def traffic_titles(attrs) -> tuple[str, str, str, str]:
    """The two panels' titles and subtitles; the time's names whose schedule and link rates it
    is (the table's ``engine`` where it carries one: ``group_traffic_table`` times the paper's)."""
    ic, compute = attrs["interconnect"], attrs["compute"]
    engine = get_engine(attrs.get("engine", "paper"))
    where = (ic.label if ic.gpus_per_node is None
             else f"{ic.label}, {gpus_text(ic.gpus_per_node)} per node: {ic.intra.name} inside, "
                  f"{ic.nics} x {ic.network.name} out")
    return ("Bytes leaving each node per step: the network's share",
            f"{where}",
            f"Step time on {attrs['gpus']:,} {attrs['device'].label}",
            f"{compute.tokens_per_gpu:,} tokens per GPU · {compute.mfu:.0%} of peak · "
            f"{engine.label} · {_rates(ic.efficiency)}")


def _rates(efficiency) -> str:
    """The link rates the collectives were timed at, in a few words."""
    if efficiency.setting == "achieved":
        return "achieved link rates"
    if efficiency.setting == "line-rate":
        return "links at line rate"
    return f"links at {efficiency.setting:.0%} of line rate"


def _apply(artists: GroupTrafficArtists, table, unit):
    scale = check_unit(unit)
    gpus = single_value(table, "gpus", "group-traffic")
    if stages_of(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    groups, crossing = _grid(table, "cross_node_bytes")
    _, step = _grid(table, "step_seconds")
    _, back_to_back = _grid(table, "communication_seconds")
    _, compute = _grid(table, "compute_seconds")
    for stage in artists.stages:
        artists.crossing[stage].set_data(groups, crossing[stage] / scale)
        artists.step[stage].set_data(groups, step[stage])
        artists.back_to_back[stage].set_data(groups, back_to_back[stage])
    first = artists.stages[0]
    artists.compute_line.set_data(groups, compute[first])
    for ax in (artists.traffic_ax, artists.time_ax):
        set_group_axis(ax, groups, gpus)
    top = max(float(v.max()) for v in crossing.values()) / scale
    artists.traffic_ax.set_ylim(0, top * 1.12 or 1)
    artists.traffic_ax.set_ylabel(f"Leaving each node [{unit}]")
    slowest = max(max(float(v.max()) for v in step.values()),
                  max(float(v.max()) for v in back_to_back.values()))
    artists.time_ax.set_ylim(0, slowest * 1.12)
    artists.time_ax.set_ylabel("Seconds per step")
    for text, value in zip(artists.titles, traffic_titles(table.attrs)):
        text.set_text(value)
    label = f"compute alone ({format_value(float(compute[first][0]))} s)"
    artists.compute_line.set_label(label)
    legend = artists.time_ax.get_legend()
    if legend is not None:
        legend.get_texts()[-1].set_text(label)


def draw_group_traffic(traffic_ax, time_ax, table: pd.DataFrame,
                       unit: str = "GB") -> GroupTrafficArtists:
    """Per stage, the bytes leaving each node per step against G on ``traffic_ax``; the step
    time (solid), all collectives back to back (dotted) and the compute (grey) on ``time_ax``."""
    table = _check(table)
    check_unit(unit)
    stages = stages_of(table)
    with style():
        crossing, step, back_to_back = {}, {}, {}
        for stage in stages:
            color, marker = STRATEGY_COLORS[stage], STRATEGY_MARKERS[stage]
            (crossing[stage],) = traffic_ax.plot([], [], color=color, lw=2.2, marker=marker,
                                                 ms=5.5, clip_on=False, zorder=3)
            (back_to_back[stage],) = time_ax.plot([], [], color=color, lw=1.8, ls=BACK_TO_BACK,
                                                  marker=marker, ms=3.5, mfc="white",
                                                  clip_on=False, zorder=3)
            (step[stage],) = time_ax.plot([], [], color=color, lw=2.2, marker=marker, ms=5.5,
                                          clip_on=False, zorder=4)
        (compute_line,) = time_ax.plot([], [], color=COMPUTE_COLOR, lw=1.6, ls=(0, (4, 3)),
                                       zorder=2)
        titles = (*make_titles(traffic_ax, "", ""), *make_titles(time_ax, "", ""))
        for ax in (traffic_ax, time_ax):
            ax.tick_params(labelsize=10)
            ax.tick_params(axis="y", length=0)
            ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
            ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
            fix_axis_labels(ax)
        artists = GroupTrafficArtists(traffic_ax, time_ax, stages, crossing, step, back_to_back,
                                      compute_line, titles)
        _apply(artists, table, unit)
        keys = [Line2D([], [], color="#444444", lw=2.2, label="step time"),
                Line2D([], [], color="#444444", lw=1.8, ls=BACK_TO_BACK,
                       label="all collectives back to back"), compute_line]
        legend_below(time_ax, keys, ncol=3)
    return artists


def update_group_traffic(artists: GroupTrafficArtists, table: pd.DataFrame,
                         unit: str = "GB") -> GroupTrafficArtists:
    """Redraw the same artists for a new table or unit (nothing is re-created)."""
    table = _check(table)
    with style():
        _apply(artists, table, unit)
    return artists


def _panel_axes(figure: Figure) -> list:
    """The three panels' Axes, top to bottom, at fixed inches from the figure's edges."""
    width, height = figure.get_size_inches()
    axes, top = [], height
    for below in BELOW:
        top -= ABOVE + PANEL
        with style():
            axes.append(figure.add_axes((LEFT / width, top / height,
                                         1 - (LEFT + RIGHT) / width, PANEL / height)))
        top -= below
    return axes


def group_tradeoff_figure(memory_table: pd.DataFrame, traffic_table: pd.DataFrame,
                          device: str | Device = "a100-80gb", unit: str = "GB",
                          dpi: float = 100
                          ) -> tuple[Figure, tuple[GroupSizeArtists, GroupTrafficArtists]]:
    """A new Figure: model state per GPU (a :func:`zerolib.core.memory.tables.group_size_table`),
    bytes sent per GPU and step time (a :func:`~zerolib.core.step.tables.group_traffic_table`
    of the same model size and GPU count) against the shard group G."""
    traffic_table = _check(traffic_table)
    gpus = single_value(traffic_table, "gpus", "group-traffic")
    if single_value(memory_table, "gpus", "group-size") != gpus:
        raise ValueError("memory_table and traffic_table must be for the same GPU count")
    if single_value(memory_table, "params", "group-size") != parameter_count(
            traffic_table.attrs["model"]):
        raise ValueError("memory_table and traffic_table must be for the same model size")
    figure = new_figure(FIGSIZE, dpi)
    memory_ax, traffic_ax, time_ax = _panel_axes(figure)
    memory = draw_group_size(memory_ax, memory_table, device, unit)
    traffic = draw_group_traffic(traffic_ax, time_ax, traffic_table, unit)
    return figure, (memory, traffic)
