"""The chapter's two figures, drawn with matplotlib's object-oriented API and updatable in place.

Each ``draw_*`` function draws a tidy table from :func:`zerolib.curves.memory_table` into a given
Axes and returns the artists it made; the matching ``update_*`` function changes those same
artists (line data, bar heights, value labels, the device line and its label, axis limits) for a
new table, device or unit. The figures in ``figures/``, the notebooks and the explorers' sliders
all go through these functions. No pyplot: figures are :class:`matplotlib.figure.Figure` objects
with an Agg canvas, so nothing here touches global state (styles apply through ``rc_context``).

Bytes inside, units at the edge: tables hold bytes; values become GB (10^9) or GiB (2^30) only
here, and every label names its unit.
"""
from __future__ import annotations

import io
import math
import struct
import zlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator
from matplotlib.transforms import Bbox, offset_copy

from .accounting import STRATEGY_NAMES, Layout, get_layout, model_state
from .curves import COLUMNS
from .devices import Device, get_device
from .units import GiB, check_unit, format_count

# Okabe & Ito, "Color Universal Design" (2008): eight colours that stay distinguishable under
# the common colour-vision deficiencies. One colour per strategy, the same in every figure.
OKABE_ITO: Mapping[str, str] = MappingProxyType({
    "black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7",
})
STRATEGY_COLORS: Mapping[int, str] = MappingProxyType({
    0: OKABE_ITO["reddish purple"],   # plain data parallelism
    1: OKABE_ITO["orange"],
    2: OKABE_ITO["sky blue"],
    3: OKABE_ITO["blue"],
})
# A second cue besides colour (lines: marker; bars: the legend order and position in a group).
STRATEGY_MARKERS: Mapping[int, str] = MappingProxyType({0: "o", 1: "s", 2: "^", 3: "D"})
DEVICE_COLOR = OKABE_ITO["vermillion"]

# Fixed sizes (inches) so every rendering of a figure has the same pixels and text size.
GPU_COUNT_FIGSIZE = (8.0, 5.6)
MODEL_SIZE_FIGSIZE = (9.0, 5.8)
# Margins around the axes (inches): room for the two-line title, the axis labels, the legend
# below the axes and, on the GPU-count figure, the value labels right of the lines.
_MARGINS = {"gpu_count": (0.95, 0.95, 1.4, 0.8), "model_size": (0.95, 0.25, 1.4, 0.8)}

# matplotlib settings for drawing and saving, applied with rc_context (never globally).
STYLE: Mapping[str, object] = MappingProxyType({
    "font.family": "DejaVu Sans",      # bundled with matplotlib: the same glyphs everywhere
    "font.size": 11,
    # Unhinted glyphs: a quarter faster to draw (the explorers redraw on every slider move) and,
    # as matplotlib's own image tests use, less dependent on the FreeType build.
    "text.hinting": "no_hinting",
    "axes.titlesize": 13,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",              # horizontal lines to read values off; no vertical ones
    "axes.axisbelow": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.8,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "svg.hashsalt": "zerolib-figures",  # fixed SVG ids (matplotlib otherwise draws random ones)
    "svg.fonttype": "path",             # text as outlines: no dependence on the reader's fonts
})
PNG_METADATA = MappingProxyType({"Software": None})            # no version string in the file
SVG_METADATA = MappingProxyType({"Date": None, "Creator": None})  # no date, no version


def style():
    """A context manager applying :data:`STYLE` (draw and save inside it)."""
    return matplotlib.rc_context(dict(STYLE))


# ---------------------------------------------------------------------------------------------
# Labels and units


def format_value(value: float) -> str:
    """Three significant digits for value labels: 1,120 / 293 / 17.5 / 4.19 / 0.25."""
    if not math.isfinite(value):
        return str(value)
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.2g}"


def device_label(device: "str | Device", unit: str = "GB") -> str:
    """``'A100 80GB capacity: 80 GiB = 85.9 GB'`` (the capacity in the figure's unit, named)."""
    device = get_device(device)
    check_unit(unit)
    gib = f"{device.capacity / GiB:g} GiB"
    if unit == "GiB":
        return f"{device.label} capacity: {gib}"
    return f"{device.label} capacity: {gib} = {device.capacity / 10**9:.1f} GB"


def layout_summary(layout: "str | Layout") -> str:
    """``'Mixed-precision Adam (ZeRO paper, K = 12): 2 + 2 + 12 = 16 bytes per parameter'``."""
    layout = get_layout(layout)
    name = layout.description or f"{layout.name} layout"
    p, g, o = layout.widths()
    return f"{name}: {p:g} + {g:g} + {o:g} = {layout.total:g} bytes per parameter"


def _plain_number(value, _position=None) -> str:
    """Axis ticks without scientific notation: 0.1, 1, 10, 1,000."""
    return f"{value:,.10g}"


# ---------------------------------------------------------------------------------------------
# Figures and rendering


def new_figure(figsize, dpi: float = 100) -> Figure:
    """A pyplot-free Figure with an Agg canvas (nothing registered with pyplot)."""
    figure = Figure(figsize=figsize, dpi=dpi, facecolor="white")
    FigureCanvasAgg(figure)
    return figure


def add_axes(figure: Figure, kind: str):
    """Axes at the fixed margins of figure ``kind`` ("gpu_count" or "model_size")."""
    left, right, bottom, top = _MARGINS[kind]
    width, height = figure.get_size_inches()
    with style():
        return figure.add_axes((left / width, bottom / height,
                                1 - (left + right) / width, 1 - (bottom + top) / height))


def render_png(figure: Figure, dpi: float | None = None) -> bytes:
    """PNG bytes, identical on every call in one environment (no software/version metadata)."""
    buffer = io.BytesIO()
    with style():
        figure.savefig(buffer, format="png", dpi=figure.dpi if dpi is None else dpi,
                       metadata=dict(PNG_METADATA))
    return buffer.getvalue()


def render_svg(figure: Figure) -> bytes:
    """SVG bytes with fixed ids and no date or version."""
    buffer = io.BytesIO()
    with style():
        figure.savefig(buffer, format="svg", metadata=dict(SVG_METADATA))
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# Input checks shared by both figures


def _check_table(table, layout: "str | Layout") -> pd.DataFrame:
    if not isinstance(table, pd.DataFrame):
        raise TypeError("table must be a DataFrame from zerolib.curves.memory_table, "
                        f"got {type(table).__name__}")
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks the columns {', '.join(missing)} (use zerolib.curves.memory_table)")
    if table.empty:
        raise ValueError("table must have at least one row")
    # The title names the layout, so the numbers must come from that layout.
    state = model_state(table["params"].to_numpy(), table["gpus"].to_numpy(),
                        table["stage"].to_numpy(), layout)
    if not np.array_equal(state.total, table["total"].to_numpy()):
        raise ValueError(f"table was not computed with layout {get_layout(layout).name!r}; "
                         "pass the layout the table was made with")
    return table


def _single(table: pd.DataFrame, column: str, figure: str) -> int:
    values = table[column].unique()
    if len(values) != 1:
        raise ValueError(f"table must hold one {column} value for the {figure} figure, "
                         f"got {len(values)}")
    return int(values[0])


def _stages(table: pd.DataFrame) -> tuple[int, ...]:
    return tuple(int(s) for s in np.unique(table["stage"].to_numpy()))


def _values(table: pd.DataFrame, index_column: str, unit: str):
    """(sorted index values, {stage: per-GPU totals in ``unit``}) from a tidy table."""
    scale = check_unit(unit)
    index, at_index = np.unique(table[index_column].to_numpy(), return_inverse=True)
    stages, at_stage = np.unique(table["stage"].to_numpy(), return_inverse=True)
    cells = at_stage * len(index) + at_index
    if len(table) != len(index) * len(stages) or len(np.unique(cells)) != len(table):
        raise ValueError(f"table must hold every stage exactly once at every {index_column} value")
    grid = np.empty(len(index) * len(stages))
    grid[cells] = table["total"].to_numpy(dtype=float) / scale
    grid = grid.reshape(len(stages), len(index))
    return index, {int(stage): grid[row] for row, stage in enumerate(stages)}


def _fix_axis_labels(ax):
    # Fixed places for the axis labels (in points from the axes): matplotlib would otherwise
    # measure every tick label on every draw to place them. The left margin leaves room for
    # tick labels up to "16,000" (10-point text).
    ax.xaxis.set_label_coords(0.5, 0, transform=offset_copy(ax.transAxes, ax.figure, y=-22,
                                                            units="points"))
    ax.xaxis.label.set_verticalalignment("top")
    ax.yaxis.set_label_coords(0, 0.5, transform=offset_copy(ax.transAxes, ax.figure, x=-50,
                                                            units="points"))
    ax.yaxis.label.set_verticalalignment("bottom")


def _make_titles(ax, title: str, subtitle: str):
    # The subtitle sits just above the axes; the title is padded to sit above the subtitle.
    # An explicit y turns off matplotlib's title auto-positioning (a costly bbox search per draw).
    title_text = ax.set_title(title, loc="left", y=1.0, pad=28, fontweight="bold", fontsize=12.5)
    subtitle_text = ax.text(0, 1.0, subtitle, transform=offset_copy(ax.transAxes, ax.figure, y=7,
                                                                     units="points"),
                            ha="left", va="bottom", fontsize=10, color="#333333")
    return title_text, subtitle_text


def _legend(ax, handles, ncol: int):
    # Below the axes, clear of the data whatever the curves do; placed in points under the
    # x-axis label so it does not depend on the axes height.
    below = offset_copy(ax.transAxes, ax.figure, y=-44, units="points")
    return ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                     bbox_transform=below, ncol=ncol, frameon=False, handlelength=2.6,
                     columnspacing=1.8)


# ---------------------------------------------------------------------------------------------
# Figure 1: per-GPU memory against the number of GPUs


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
    unit: str = "GB"
    log_x: bool = field(default=False)

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


def _apply_gpu_count(artists: GpuCountArtists, table, device, unit, layout):
    ax = artists.ax
    params = _single(table, "params", "GPU-count")
    if _stages(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    gpus, values = _values(table, "gpus", unit)
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
    if log_x != artists.log_x:
        if log_x:
            ax.set_xscale("log", base=2)
        else:
            ax.set_xscale("linear")
        artists.log_x = log_x
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
    ax.xaxis.set_major_formatter(FuncFormatter(_plain_number))
    ax.set_xlabel("Data-parallel GPUs" + (" (log scale)" if log_x else ""))

    top = max(max(float(v.max()) for v in values.values()), capacity) * 1.1
    ax.set_ylim(0, top)
    ax.set_ylabel(f"Model state per GPU [{unit}]")

    artists.device_line.set_ydata([capacity, capacity])
    artists.device_line.set_label(device_label(device, unit))
    artists.device_legend_text.set_text(device_label(device, unit))

    last = {stage: float(values[stage][-1]) for stage in artists.stages}
    heights = _spread([last[s] for s in artists.stages], gap=0.045 * top)
    for stage, height in zip(artists.stages, heights):
        label = artists.end_labels[stage]
        label.set_position((high, height))
        label.set_text(f"{format_value(last[stage])} {unit}")

    title, subtitle = _gpu_count_titles(params, gpus, layout)
    artists.title.set_text(title)
    artists.subtitle.set_text(subtitle)
    artists.unit = unit


def draw_memory_vs_gpu_count(ax, table: pd.DataFrame, device: "str | Device" = "a100-80gb",
                             unit: str = "GB", layout: "str | Layout" = "mixed-adam") -> GpuCountArtists:
    """Per-GPU model state against GPU count: one line per stage, the device's capacity dashed.

    ``table`` holds one model size (``memory_table(params, gpus, stages, layout)``).
    """
    table = _check_table(table, layout)
    _single(table, "params", "GPU-count")
    check_unit(unit)
    stages = _stages(table)
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
        legend = _legend(ax, [*lines.values(), device_line], ncol=2)
        title, subtitle = _make_titles(ax, "", "")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", length=0)       # the grid lines mark the values
        ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
        _fix_axis_labels(ax)
        artists = GpuCountArtists(ax, stages, lines, end_labels, device_line, legend, title,
                                  subtitle, unit)
        _apply_gpu_count(artists, table, device, unit, layout)
    return artists


def update_memory_vs_gpu_count(artists: GpuCountArtists, table: pd.DataFrame,
                               device: "str | Device" = "a100-80gb", unit: str = "GB",
                               layout: "str | Layout" = "mixed-adam") -> GpuCountArtists:
    """Redraw the same artists for a new table, device or unit (nothing is re-created)."""
    table = _check_table(table, layout)
    with style():
        _apply_gpu_count(artists, table, device, unit, layout)
    return artists


# ---------------------------------------------------------------------------------------------
# Figure 2: per-GPU memory across model sizes at one GPU count


@dataclass(eq=False)
class ModelSizeArtists:
    """What :func:`draw_memory_vs_model_size` drew; :func:`update_memory_vs_model_size` changes it.

    ``bars[stage]`` is that stage's BarContainer (one bar per model), ``value_labels[stage]`` the
    Text above each bar. When the number of models changes, the bars and their labels are
    replaced in the same Axes; otherwise the same rectangles get new heights.
    """

    ax: object
    stages: tuple[int, ...]
    bars: dict
    value_labels: dict
    device_line: object
    legend: object
    title: object
    subtitle: object
    params: tuple[int, ...] = ()
    unit: str = "GB"

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(self.stages)]


def _model_size_titles(gpus: int, params, layout) -> tuple[str, str]:
    on = f"on {gpus:,} {'GPU' if gpus == 1 else 'GPUs'}"
    if len(params) == 1:
        what = f"a {format_count(int(params[0]))}-parameter model {on}"
    else:
        what = (f"{format_count(int(params[0]))}- to {format_count(int(params[-1]))}-parameter "
                f"models, each {on}")
    return f"Per-GPU model state of {what}", layout_summary(layout)


def _bar_geometry(n_models: int, n_stages: int):
    group = 0.82
    width = group / n_stages
    offsets = (np.arange(n_stages) - (n_stages - 1) / 2) * width
    return np.arange(n_models, dtype=float), width, offsets


def _labels_fit(ax, n_models: int, n_stages: int) -> bool:
    """Value labels are drawn when a bar is at least as wide as a rotated 8-point label."""
    axes_width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    bar_width_pt = axes_width_pt / max(n_models, 1) * 0.82 / n_stages
    return bar_width_pt >= 10


_VALUE_LABEL_SIZE = 8  # points
# A white backing for a value label the device line crosses (only those: each costs a patch).
_LABEL_BACKING = MappingProxyType({"facecolor": "white", "edgecolor": "none", "alpha": 0.85,
                                   "pad": 0.6})


def _crosses(ax, height: float, text: str, line: float) -> bool:
    """Whether the rotated value label above a bar of ``height`` reaches the line at ``line``.

    On the log axis a label starts 2 points above its bar and is about 0.64 em per character
    long (DejaVu Sans digits), so this is arithmetic on the axes' points per decade.
    """
    low, high = ax.get_ylim()
    per_decade = (ax.get_position().height * ax.figure.get_figheight() * 72
                  / math.log10(high / low))
    start = (math.log10(max(height, low)) - math.log10(low)) * per_decade + 2
    end = start + len(text) * 0.64 * _VALUE_LABEL_SIZE
    at = (math.log10(max(line, low)) - math.log10(low)) * per_decade
    return start - 3 <= at <= end + 3


def _make_bars(artists: ModelSizeArtists, n_models: int):
    ax = artists.ax
    x, width, offsets = _bar_geometry(n_models, len(artists.stages))
    label_offset = offset_copy(ax.transData, ax.figure, y=2, units="points")
    for i, stage in enumerate(artists.stages):
        artists.bars[stage] = ax.bar(x + offsets[i], np.ones(n_models), width,
                                     color=STRATEGY_COLORS[stage], edgecolor="white", linewidth=0.6,
                                     label=STRATEGY_NAMES[stage], zorder=3)
        artists.value_labels[stage] = [
            ax.text(xi + offsets[i], 1, "", transform=label_offset, rotation=90, ha="center",
                    va="bottom", fontsize=_VALUE_LABEL_SIZE, color="#222222", zorder=6,
                    clip_on=True)
            for xi in x]


def _remove_bars(artists: ModelSizeArtists):
    for stage in artists.stages:
        artists.bars[stage].remove()
        for text in artists.value_labels[stage]:
            text.remove()


def _apply_model_size(artists: ModelSizeArtists, table, device, unit, layout):
    ax = artists.ax
    gpus = _single(table, "gpus", "model-size")
    if _stages(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    params, values = _values(table, "params", unit)
    device = get_device(device)
    capacity = device.capacity / check_unit(unit)

    if len(params) != len(artists.params):
        if artists.params:
            _remove_bars(artists)
        _make_bars(artists, len(params))
    artists.params = tuple(int(p) for p in params)

    for stage in artists.stages:
        for rectangle, height in zip(artists.bars[stage], values[stage]):
            rectangle.set_height(height)

    x = np.arange(len(params))
    ax.set_xticks(x, [format_count(int(p)) for p in params])
    ax.set_xlim(-0.6, len(params) - 0.4)
    ax.set_xlabel("Model size (parameters)")   # the title names the GPU count

    # Log scale: the values span several decades (0.25 GB to 1,120 GB in the chapter's figure).
    # Above the tallest bar, leave room for its rotated value label (about 34 points).
    everything = np.concatenate([*values.values(), [capacity]])
    positive = everything[everything > 0]
    if positive.size == 0:
        positive = np.array([1.0])
    low = 10 ** math.floor(math.log10(positive.min()) - 0.15)
    span = math.log10(positive.max()) - math.log10(low)
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    room = max(0.3, 34 * span / (height_pt - 34))
    ax.set_ylim(low, positive.max() * 10**room)
    ax.set_ylabel(f"Model state per GPU [{unit}] (log scale)")

    show_labels = _labels_fit(ax, len(params), len(artists.stages))
    for stage in artists.stages:
        for text, height in zip(artists.value_labels[stage], values[stage]):
            text.set_y(height)
            text.set_text(format_value(height))
            text.set_visible(show_labels)
            crossing = show_labels and _crosses(ax, height, text.get_text(), capacity)
            if crossing != (text.get_bbox_patch() is not None):
                text.set_bbox(dict(_LABEL_BACKING) if crossing else None)

    artists.device_line.set_ydata([capacity, capacity])
    artists.device_line.set_label(device_label(device, unit))
    artists.device_legend_text.set_text(device_label(device, unit))
    title, subtitle = _model_size_titles(gpus, params, layout)
    artists.title.set_text(title)
    artists.subtitle.set_text(subtitle)
    artists.unit = unit


def draw_memory_vs_model_size(ax, table: pd.DataFrame, device: "str | Device" = "a100-80gb",
                              unit: str = "GB", layout: "str | Layout" = "mixed-adam") -> ModelSizeArtists:
    """Grouped bars: per-GPU model state of each model under each stage, on a log scale.

    ``table`` holds one GPU count (``memory_table(params, gpus, stages, layout)``).
    """
    table = _check_table(table, layout)
    _single(table, "gpus", "model-size")
    check_unit(unit)
    stages = _stages(table)
    with style():
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
        ax.yaxis.set_minor_locator(NullLocator())  # decades suffice: every bar carries its value
        device_line = ax.axhline(1, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=5,
                                 label=device_label(device, unit))
        artists = ModelSizeArtists(ax, stages, {}, {}, device_line, None, None, None)
        _make_bars(artists, len(np.unique(table["params"])))
        artists.params = tuple(np.unique(table["params"]).tolist())
        artists.legend = _legend(ax, [*artists.bars.values(), device_line], ncol=2)
        artists.title, artists.subtitle = _make_titles(ax, "", "")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", which="both", length=0)   # the grid lines mark the decades
        ax.tick_params(axis="x", length=0, labelsize=11)
        _fix_axis_labels(ax)
        _apply_model_size(artists, table, device, unit, layout)
    return artists


def update_memory_vs_model_size(artists: ModelSizeArtists, table: pd.DataFrame,
                                device: "str | Device" = "a100-80gb", unit: str = "GB",
                                layout: "str | Layout" = "mixed-adam") -> ModelSizeArtists:
    """Redraw for a new table, device or unit: new bar heights, labels, line and limits."""
    table = _check_table(table, layout)
    with style():
        _apply_model_size(artists, table, device, unit, layout)
    return artists


# ---------------------------------------------------------------------------------------------
# Whole figures at the fixed sizes


def gpu_count_figure(table: pd.DataFrame, device="a100-80gb", unit="GB", layout="mixed-adam",
                     dpi: float = 100) -> tuple[Figure, GpuCountArtists]:
    """A new Figure of :data:`GPU_COUNT_FIGSIZE` with :func:`draw_memory_vs_gpu_count` drawn."""
    figure = new_figure(GPU_COUNT_FIGSIZE, dpi)
    artists = draw_memory_vs_gpu_count(add_axes(figure, "gpu_count"), table, device, unit, layout)
    return figure, artists


def model_size_figure(table: pd.DataFrame, device="a100-80gb", unit="GB", layout="mixed-adam",
                      dpi: float = 100) -> tuple[Figure, ModelSizeArtists]:
    """A new Figure of :data:`MODEL_SIZE_FIGSIZE` with :func:`draw_memory_vs_model_size` drawn."""
    figure = new_figure(MODEL_SIZE_FIGSIZE, dpi)
    artists = draw_memory_vs_model_size(add_axes(figure, "model_size"), table, device, unit, layout)
    return figure, artists


# ---------------------------------------------------------------------------------------------
# Fast repeated rendering for the explorers


def _text_key(text) -> tuple:
    return (text.get_text(), tuple(text.get_position()), text.get_color(), text.get_fontsize(),
            text.get_fontweight(), text.get_rotation(), text.get_visible())


def _block_key(artist) -> tuple:
    texts = artist.get_texts() if hasattr(artist, "get_texts") else [artist]
    return tuple(_text_key(t) for t in texts)


def text_blocks(artists) -> list:
    """The slow-changing text blocks of a drawn figure: title, subtitle, legend, axis labels."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.xaxis.label, ax.yaxis.label]


class IncrementalPng:
    """Render one figure to PNG again and again, re-drawing slow text blocks only when they change.

    Text is what costs most in an Agg draw (matplotlib lays out and rasterises every glyph on
    every draw), and the title, subtitle, legend and axis labels change far less often than the
    data. This renderer keeps the pixels of those ``blocks`` (all outside the axes) from the last
    draw that showed them. When a block's text is unchanged, the figure is drawn without it and
    the kept pixels are pasted back: the same pixels a full draw gives. If anything drawn afresh
    reaches into a kept block (checked after the draw), the figure is drawn again in full.
    """

    def __init__(self, figure: Figure, blocks=(), compress_level: int = 1):
        self.figure = figure
        self.blocks = list(blocks)
        self.compress_level = compress_level
        self._kept: dict[int, tuple] = {}   # block index -> (key, pixel box, BufferRegion)
        self.full_draws = 0

    def _box(self, artist, renderer):
        """Whole-pixel extent of ``artist`` with a 2-pixel margin, clipped to the canvas."""
        box = artist.get_window_extent(renderer)
        width, height = self.figure.canvas.get_width_height(physical=True)
        return (max(math.floor(box.x0) - 2, 0), max(math.floor(box.y0) - 2, 0),
                min(math.ceil(box.x1) + 2, width), min(math.ceil(box.y1) + 2, height))

    @staticmethod
    def _overlap(a, b) -> bool:
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    def _key(self, block) -> tuple:
        return (self.figure.dpi, tuple(self.figure.get_size_inches()), _block_key(block))

    def _others(self, reuse):
        """Everything drawn afresh that could reach outside the axes (unclipped texts)."""
        others = [b for i, b in enumerate(self.blocks) if i not in reuse]
        for ax in self.figure.axes:
            texts = [*ax.texts, *ax.xaxis.get_ticklabels(), *ax.yaxis.get_ticklabels()]
            others += [t for t in texts if t not in self.blocks and t.get_visible()
                       and t.get_text() and not t.get_clip_on()]
        return others

    def _draw(self, reuse, renderer) -> bool:
        """Draw all but the reused blocks; False if a fresh artist overlaps a reused block."""
        hidden = [self.blocks[i] for i in reuse]
        for artist in hidden:
            artist.set_visible(False)
        try:
            self.figure.canvas.draw()
        finally:
            for artist in hidden:
                artist.set_visible(True)
        if not reuse:
            return True
        boxes = [self._box(a, renderer) for a in self._others(reuse)]
        return not any(self._overlap(self._kept[i][1], b) for i in reuse for b in boxes)

    def render(self) -> bytes:
        canvas = self.figure.canvas
        with style():
            renderer = canvas.get_renderer()
            reuse = {i for i, block in enumerate(self.blocks)
                     if block.get_visible() and i in self._kept
                     and self._kept[i][0] == self._key(block)}
            if not self._draw(reuse, renderer):
                reuse = set()
                self._draw(reuse, renderer)
            if not reuse:
                self.full_draws += 1
            for i in sorted(reuse):
                canvas.restore_region(self._kept[i][2])
            for i, block in enumerate(self.blocks):
                if i not in reuse and block.get_visible():
                    box = self._box(block, renderer)
                    self._kept[i] = (self._key(block), box,
                                     canvas.copy_from_bbox(Bbox.from_extents(*box)))
            return encode_png(np.asarray(canvas.buffer_rgba()), self.compress_level)


def encode_png(rgba: np.ndarray, compress_level: int = 1) -> bytes:
    """A minimal PNG of an opaque RGBA pixel array: 8-bit RGB, no filtering, no metadata.

    About three times faster than Pillow's encoder on a figure (which tries a filter per row)
    and no larger: a figure is mostly flat white. Deterministic: the bytes depend only on the
    pixels and ``compress_level``.
    """
    height, width = rgba.shape[:2]
    rows = np.empty((height, 1 + 3 * width), dtype=np.uint8)
    rows[:, 0] = 0                                   # filter type 0 (None) on every row
    rows[:, 1:] = rgba[..., :3].reshape(height, 3 * width)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload)))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit truecolour RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), compress_level)) + chunk(b"IEND", b""))
