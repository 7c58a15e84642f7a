"""Figure: the trade ZeRO makes, per-GPU memory against step time, one point per stage.

:func:`draw_memory_vs_step_time` draws a :func:`zerolib.core.step.tables.tradeoff_frame` and
returns the artists; :func:`update_memory_vs_step_time` changes the same artists (points, the
segment from compute time to step time that shows the wait for the network, labels, the
device line, titles, limits) for a new frame, device or unit. The published figure, the
notebook and the explorer all draw through these. The subtitle names the engine whose schedule
and overlap rule the step times follow (the frame's ``attrs["engine"]``); an engine that offers
fewer stages than were drawn (FSDP2 has no stage 1) leaves the others' points out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import blended_transform_factory, offset_copy

from zerolib.chapter.charts.stage_lines import spread
from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.style import (
    DEVICE_COLOR,
    STRATEGY_COLORS,
    STRATEGY_MARKERS,
    add_axes,
    device_label,
    fix_axis_labels,
    gpus_text,
    legend_below,
    make_titles,
    new_figure,
    plain_number,
    show_device_and_titles,
    style,
)
from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.step.tables import TRADEOFF_COLUMNS
from zerolib.core.units import GB, check_unit, format_value

FIGSIZE = (8.8, 5.8)  # inches
MARGINS = (0.95, 2.6, 1.45, 0.8)  # left, right (the point labels), bottom (legend), top
COMPUTE_COLOR = "#777777"
# Where the data (compute time to the slowest step) sits along the x axis, as fractions of it:
# room on the left for the compute line's label, on the right for the points. Two thirds of
# the axis show what differs between the stages (an axis from 0 squeezed it into 5 %).
DATA_SPAN = (0.25, 0.92)
# The narrowest x range, as a fraction of the step time: stages less than a third of a per
# cent apart (or equal, with nothing to wait for) are drawn in a window of this width.
MIN_WINDOW = 0.005
# The label room right of the points and the capacity line's clearance, in points.
LABEL_CLEAR_PT = 9


def _check(frame) -> pd.DataFrame:
    return check_tidy(frame, TRADEOFF_COLUMNS, ("model", "gpus", "interconnect", "device",
                                                "compute", "layout", "bus_bandwidth"),
                      "zerolib.core.step.tables.tradeoff_frame")


def tradeoff_titles(attrs) -> tuple[str, str]:
    """The title (model, GPUs, device) and subtitle (interconnect, tokens, utilisation)."""
    ic, compute = attrs["interconnect"], attrs["compute"]
    where = ic.name if ic.gpus_per_node is None else f"{ic.name}, {gpus_text(ic.gpus_per_node)} per node"
    title = (f"Memory against step time: {attrs['model'].name} on {attrs['gpus']:,} "
             f"{attrs['device'].label}")
    subtitle = (f"{where} ({format_value(attrs['bus_bandwidth'] / GB)} GB/s) · "
                f"{compute.tokens_per_gpu:,} tokens per GPU · {compute.mfu:.0%} of peak · "
                f"{engine_words(attrs)}")
    return title, subtitle


def engine_words(attrs) -> str:
    """Whose schedule the step times follow: "the ZeRO paper's schedule", "DeepSpeed
    0.19.8's schedule" (frames without an engine are the paper's)."""
    engine = attrs.get("engine")
    label = "the ZeRO paper's schedule" if engine is None else engine.label
    return label if label.endswith("schedule") else f"{label}'s schedule"


@dataclass(eq=False)
class TradeoffArtists:
    """What :func:`draw_memory_vs_step_time` drew; :func:`update_memory_vs_step_time`
    changes it. ``points``/``waits``/``labels`` are keyed by stage."""

    ax: object
    stages: tuple[int, ...]
    points: dict
    waits: dict            # stage -> Line2D from compute time to step time
    labels: dict           # stage -> Text
    compute_line: object   # Line2D: the compute time, the same for every stage
    compute_label: object  # Text at the top of that line
    device_line: object
    legend: object
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(self.stages)]


def _apply(artists: TradeoffArtists, frame, device, unit):
    ax = artists.ax
    stages = tuple(int(s) for s in frame["stage"])
    if not set(stages) <= set(artists.stages):
        raise ValueError(f"frame must hold some of the stages {artists.stages} drawn first")
    scale = check_unit(unit)
    device = get_device(device)
    capacity = device.capacity / scale
    memory = frame["memory_bytes"].to_numpy(dtype=float) / scale
    step = frame["step_seconds"].to_numpy(dtype=float)
    compute = frame["compute_seconds"].to_numpy(dtype=float)
    wait = frame["network_wait_fraction"].to_numpy(dtype=float)

    left, right = step_limits(compute, step)
    ax.set_xlim(left, right)
    top = max(float(memory.max()), capacity) * 1.12
    ax.set_ylim(0, top)
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    heights = spread(memory, gap=0.06 * top, line=capacity,
                     clear=LABEL_CLEAR_PT / height_pt * top)
    for stage in set(artists.stages) - set(stages):   # a stage this engine does not offer
        artists.points[stage].set_data([], [])
        artists.waits[stage].set_data([], [])
        artists.labels[stage].set_text("")
    for text, stage in zip(artists.legend.get_texts(), artists.stages):
        text.set_alpha(1.0 if stage in stages else 0.35)
    for i, stage in enumerate(stages):
        artists.points[stage].set_data([step[i]], [memory[i]])
        artists.waits[stage].set_data([compute[i], step[i]], [memory[i], memory[i]])
        label = artists.labels[stage]
        label.set_position((step[i], heights[i]))
        label.set_text(f"{format_value(memory[i])} {unit} · {format_value(step[i])} s · "
                       f"{wait[i]:.0%} waiting")
    artists.compute_line.set_data([compute[0], compute[0]], [0, 1])
    artists.compute_label.set_x(compute[0])
    artists.compute_label.set_text(f"compute {format_value(compute[0])} s")
    ax.set_xlabel(f"Step time [s] (the axis starts at {plain_number(left)} s, not at 0)")
    ax.set_ylabel(f"Peak memory per GPU [{unit}]")
    show_device_and_titles(artists, device, unit, capacity, tradeoff_titles(frame.attrs))


def step_limits(compute, step) -> tuple[float, float]:
    """The x range: compute time to the slowest step placed at :data:`DATA_SPAN` of the axis,
    or, for stages closer than that, centred in a window :data:`MIN_WINDOW` of the step time
    wide; the left end rounded down to a round number (the axis label names it)."""
    low = float(min(compute.min(), step.min()))
    high = float(step.max())
    first, last = DATA_SPAN
    width = (high - low) / (last - first)
    if width < MIN_WINDOW * high:
        width = MIN_WINDOW * high
        first = last = 0.5 - (high - low) / width / 2
        last = 1 - first
    # Down to a hundredth of the window's order of magnitude: "0.404 s", not "0.40347 s".
    unit = 10 ** math.floor(math.log10(width)) / 100
    left = max(0.0, math.floor((low - first * width) / unit) * unit)
    return left, high + (1 - last) * width


def draw_memory_vs_step_time(ax, frame: pd.DataFrame, device: str | Device | None = None,
                             unit: str = "GB", stages=None) -> TradeoffArtists:
    """One point per stage at (step time, peak memory per GPU); a line back to the compute time
    shows how long the GPU waits for the network; the dashed line is the device's capacity
    (``device`` defaults to the one the frame was timed on). ``stages`` (default: the frame's)
    are the stages artists are made for, so that a later frame of another engine can show
    some of them."""
    frame = _check(frame)
    device = frame.attrs["device"] if device is None else get_device(device)
    check_unit(unit)
    stages = (tuple(int(s) for s in frame["stage"]) if stages is None
              else tuple(sorted({int(s) for s in stages})))
    figure = ax.figure
    with style():
        points, waits, labels = {}, {}, {}
        for stage in stages:
            color = STRATEGY_COLORS[stage]
            (waits[stage],) = ax.plot([], [], color=color, lw=5, alpha=0.35,
                                      solid_capstyle="butt", zorder=3)
            (points[stage],) = ax.plot([], [], linestyle="none", marker=STRATEGY_MARKERS[stage],
                                       ms=10, color=color, markeredgecolor="white",
                                       label=STRATEGY_NAMES[stage], zorder=4, clip_on=False)
            labels[stage] = ax.text(0, 0, "", transform=offset_copy(ax.transData, figure, x=10,
                                                                    units="points"),
                                    ha="left", va="center", fontsize=9, color=color,
                                    fontweight="bold", clip_on=False, linespacing=1.2)
        compute_line = ax.axvline(0, color=COMPUTE_COLOR, ls=(0, (1, 2)), lw=1.4, zorder=2,
                                  label="compute alone: the step without any wait")
        compute_label = ax.text(0, 1, "", transform=offset_copy(
            blended_transform_factory(ax.transData, ax.transAxes), figure, x=-4, y=-2,
            units="points"), ha="right", va="top", fontsize=9, color=COMPUTE_COLOR)
        device_line = ax.axhline(0, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=2,
                                 label=device_label(device, unit))
        handles = [*points.values(), device_line, compute_line]
        legend = legend_below(ax, handles, ncol=2)
        title, subtitle = make_titles(ax, "", "")
        ax.grid(axis="x", color="#eeeeee")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", length=0)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
            axis.set_major_formatter(FuncFormatter(plain_number))
        fix_axis_labels(ax)
        artists = TradeoffArtists(ax, stages, points, waits, labels, compute_line, compute_label,
                                  device_line, legend, title, subtitle)
        _apply(artists, frame, device, unit)
    return artists


def update_memory_vs_step_time(artists: TradeoffArtists, frame: pd.DataFrame,
                               device: str | Device | None = None,
                               unit: str = "GB") -> TradeoffArtists:
    """Redraw the same artists for a new frame, device or unit (nothing is re-created)."""
    frame = _check(frame)
    device = frame.attrs["device"] if device is None else get_device(device)
    with style():
        _apply(artists, frame, device, unit)
    return artists


def memory_vs_step_time_figure(frame: pd.DataFrame, device: str | Device | None = None,
                               unit: str = "GB", dpi: float = 100
                               ) -> tuple[Figure, TradeoffArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_memory_vs_step_time` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_memory_vs_step_time(add_axes(figure, MARGINS), frame, device, unit)
    return figure, artists


def tradeoff_blocks(artists: TradeoffArtists) -> list:
    """The slow-changing text blocks a fast renderer may re-use while they are unchanged."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.xaxis.label, ax.yaxis.label]

