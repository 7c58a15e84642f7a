"""The chapter's figures, drawn with matplotlib's object-oriented API and updatable in place.

Each ``draw_*`` function draws a tidy table from :func:`zerolib.core.tables.memory_table` into a given
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
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullLocator,
)
from matplotlib.transforms import Bbox, blended_transform_factory, offset_copy

from zerolib.core.accounting import (
    CATEGORIES,
    STRATEGY_NAMES,
    Layout,
    get_layout,
    model_state,
)
from zerolib.core.devices import Device, capacity_text, get_device
from zerolib.core.models import MODELS
from zerolib.core.tables import COLUMNS
from zerolib.core.units import GB, GiB, check_unit, format_count
from zerolib.core.working_set import TERMS, WorkingSetSettings, peak_frame

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
WILL_IT_FIT_FIGSIZE = (10.4, 6.0)
# Margins around the axes (inches): room for the two-line title, the axis labels, the legend
# below the axes and, on the GPU-count figure, the value labels right of the lines.
_MARGINS = {"gpu_count": (0.95, 0.95, 1.4, 0.8), "model_size": (0.95, 0.25, 1.4, 0.8),
            "will_it_fit": (0.95, 4.35, 0.8, 0.8)}  # right: capacity tag, then the legend

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
    return f"{get_device(device).label} capacity: {capacity_text(device, unit)}"


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
    """Axes at the fixed margins of figure ``kind`` ("gpu_count", "model_size", "will_it_fit")."""
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
        raise TypeError("table must be a DataFrame from zerolib.core.tables.memory_table, "
                        f"got {type(table).__name__}")
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks the columns {', '.join(missing)} (use zerolib.core.tables.memory_table)")
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


def _show_device_and_titles(artists, device: Device, unit: str, capacity: float,
                            titles: tuple[str, str]):
    """What every figure updates alike: the capacity line and its legend entry, the titles."""
    label = device_label(device, unit)
    artists.device_line.set_ydata([capacity, capacity])
    artists.device_line.set_label(label)
    artists.device_legend_text.set_text(label)
    artists.title.set_text(titles[0])
    artists.subtitle.set_text(titles[1])


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
    ax.xaxis.set_major_formatter(FuncFormatter(_plain_number))
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

    _show_device_and_titles(artists, device, unit, capacity,
                            _gpu_count_titles(params, gpus, layout))


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
                                  subtitle)
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

    _show_device_and_titles(artists, device, unit, capacity,
                            _model_size_titles(gpus, params, layout))


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
# Figure 3: will it fit? The peak per GPU, stage by stage, against the device


# Paul Tol's "muted" qualitative scheme (personal.sron.nl/~pault, "Colour schemes", 2021): nine
# colours that stay distinguishable under the common colour-vision deficiencies, plus a pale
# grey. The components of the peak get these, never the strategy colours (those stay with the
# strategies): persistent state in the cool colours, the working set in the warm ones, the
# reserve (an allowance, not a tensor) in the grey.
TOL_MUTED: Mapping[str, str] = MappingProxyType({
    "indigo": "#332288", "cyan": "#88CCEE", "teal": "#44AA99", "green": "#117733",
    "olive": "#999933", "sand": "#DDCC77", "rose": "#CC6677", "wine": "#882255",
    "purple": "#AA4499", "pale grey": "#DDDDDD",
})
COMPONENTS = (*CATEGORIES, *TERMS)   # bottom to top of every bar
COMPONENT_COLORS: Mapping[str, str] = MappingProxyType({
    "parameters": TOL_MUTED["indigo"], "gradients": TOL_MUTED["cyan"],
    "optimizer": TOL_MUTED["teal"], "activations": TOL_MUTED["rose"],
    "logits_loss": TOL_MUTED["wine"], "ddp_buckets": TOL_MUTED["sand"],
    "reduce_bucket": TOL_MUTED["olive"], "allgather_bucket": TOL_MUTED["purple"],
    "gathered_parameters": TOL_MUTED["green"], "reserve": TOL_MUTED["pale grey"],
})
COMPONENT_LABELS: Mapping[str, str] = MappingProxyType({
    "parameters": "Parameters", "gradients": "Gradients", "optimizer": "Optimizer state",
    "activations": "Activations saved for backward", "logits_loss": "Logits and loss",
    "ddp_buckets": "DDP gradient buckets (stage 0)",
    "reduce_bucket": "Reduce bucket (stages 1-3)",
    "allgather_bucket": "All-gather bucket (stages 1-2)",
    "gathered_parameters": "Gathered parameters (stage 3)",
    "reserve": "Reserve: CUDA context, fragmentation",
})
PEAK_FRAME_COLUMNS = ("model", "gpus", "stage", "strategy", "layer", "component", "bytes")
RECOMPUTE_WORDS = MappingProxyType({"none": "no recomputation", "selective": "selective recomputation",
                                    "full": "full recomputation"})
_COMPONENT_INDEX = MappingProxyType({c: i for i, c in enumerate(COMPONENTS)})
_STACK_WIDTH = 0.62
_SEGMENT_LABEL_SIZE = 8        # points; a segment shows its value when at least 12 points tall
_ZERO_EVERYWHERE = "#777777"   # legend text of a component that is 0 in every bar drawn
# Room above the tallest bar for its two label lines (value, verdict), in points.
_ABOVE_BAR_PT = 36
# The capacity tag sits right of the axes at the line's height; the legend starts beyond it.
_TAG_OFFSET_PT, _LEGEND_OFFSET_PT = 6, 72
_PEAK_LABEL_BACKING = MappingProxyType({"facecolor": "white", "edgecolor": "none", "pad": 2.0})
DEFAULT_SETTINGS = WorkingSetSettings()   # frozen: one shared default is safe


def _ink(colour: str) -> str:
    """Black or white, whichever has the higher WCAG contrast ratio on ``colour``."""
    channels = np.array(matplotlib.colors.to_rgb(colour))
    linear = np.where(channels <= 0.04045, channels / 12.92, ((channels + 0.055) / 1.055) ** 2.4)
    luminance = float(linear @ [0.2126, 0.7152, 0.0722])
    return "#000000" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "#ffffff"


def _wrap_strategy(stage: int) -> str:
    """The name under a bar, on two lines: 'ZeRO stage 1\\n(optimizer)', 'Plain data\\nparallelism'."""
    name = STRATEGY_NAMES[stage]
    if " (" in name:
        return name.replace(" (", "\n(", 1)
    words = name.split()
    half = (len(words) + 1) // 2
    return " ".join(words[:half]) + "\n" + " ".join(words[half:])


def _size_words(n_bytes: int) -> str:
    return f"{n_bytes // GiB:,} GiB" if n_bytes % GiB == 0 else f"{n_bytes / GB:.3g} GB"


def will_it_fit_titles(model: str, gpus: int, settings: WorkingSetSettings, layout) -> tuple[str, str]:
    """The figure's title (model, GPUs) and subtitle (every setting that shapes the bars)."""
    layout = get_layout(layout)
    title = f"Will it fit? Peak memory per GPU of {model} on {gpus:,} {'GPU' if gpus == 1 else 'GPUs'}"
    parts = [f"sequence {settings.seq_len:,}", f"micro-batch {settings.micro_batch:,}",
             RECOMPUTE_WORDS[settings.recompute],
             "flash attention" if settings.flash_attention else "attention scores stored (no flash)"]
    if settings.tensor_parallel != 1:
        parts.append(f"{settings.tensor_parallel}-way tensor parallel"
                     + (" + sequence parallel" if settings.sequence_parallel else ""))
    parts += [f"{layout.name} ({layout.total:g} bytes/param)",
              f"reserve {_size_words(settings.reserve_bytes)}"]
    return title, " · ".join(parts)


def _check_peak_frame(frame, settings, layout):
    """(model, gpus, stages, bytes grid [stage, component]) of a frame from ``peak_frame``."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError("frame must be a DataFrame from zerolib.core.working_set.peak_frame, "
                        f"got {type(frame).__name__}")
    if not isinstance(settings, WorkingSetSettings):
        raise TypeError(f"settings must be a WorkingSetSettings, got {type(settings).__name__}")
    missing = [c for c in PEAK_FRAME_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks the columns {', '.join(missing)} "
                         "(use zerolib.core.working_set.peak_frame)")
    if frame.empty:
        raise ValueError("frame must have at least one row")
    models = frame["model"].unique()
    if len(models) != 1:
        raise ValueError(f"frame must hold one model for the will-it-fit figure, got {len(models)}")
    gpus = _single(frame, "gpus", "will-it-fit")
    stages = _stages(frame)
    component = frame["component"].map(_COMPONENT_INDEX)
    if (component.isna().any() or len(frame) != len(stages) * len(COMPONENTS)
            or frame.duplicated(["stage", "component"]).any()):
        raise ValueError("frame must hold every component exactly once for every stage "
                         "(use zerolib.core.working_set.peak_frame)")
    grid = np.zeros((len(stages), len(COMPONENTS)), dtype=np.int64)
    grid[np.searchsorted(stages, frame["stage"].to_numpy()),
         component.to_numpy(dtype=np.int64)] = frame["bytes"].to_numpy(dtype=np.int64)
    model = str(models[0])
    # The subtitle names the settings and the layout, so the numbers must come from them.
    if model in MODELS:
        expected = peak_frame(model, gpus, stages, settings, layout)
        if not np.array_equal(expected["bytes"].to_numpy().reshape(grid.shape), grid):
            raise ValueError(f"frame was not computed with these settings and layout "
                             f"{get_layout(layout).name!r}; pass the ones it was made with")
    return model, gpus, stages, grid


@dataclass(eq=False)
class WillItFitArtists:
    """What :func:`draw_will_it_fit` drew; :func:`update_will_it_fit` changes it.

    ``bars[component]`` is that component's BarContainer (one rectangle per stage, stacked
    bottom to top in :data:`COMPONENTS` order), ``segment_labels[component]`` the value written
    inside each rectangle (hidden when too thin), ``peak_labels``/``verdict_labels`` the total and
    "fits"/"too big" above each bar, ``stage_labels`` the strategy under each bar (texts rather
    than tick labels: they never change, so the explorer re-uses their pixels), ``device_tag``
    the capacity written at the line's right end.
    """

    ax: object
    stages: tuple[int, ...]
    bars: dict
    segment_labels: dict
    peak_labels: dict
    verdict_labels: dict
    stage_labels: dict
    device_line: object
    device_tag: object
    device_legend: object       # one entry: the device line and its capacity
    legend: object              # the components, in two groups
    legend_index: dict          # component -> position among the legend's texts
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.device_legend.get_texts()[0]

    def legend_text(self, component: str):
        return self.legend.get_texts()[self.legend_index[component]]


def _apply_will_it_fit(artists: WillItFitArtists, frame, device, unit, settings, layout):
    ax = artists.ax
    model, gpus, stages, grid = _check_peak_frame(frame, settings, layout)
    if stages != artists.stages:
        raise ValueError(f"frame must hold the stages {artists.stages} drawn first")
    scale = check_unit(unit)
    device = get_device(device)
    capacity = device.capacity / scale
    values = grid / scale
    tops = np.cumsum(values, axis=1)
    bottoms = tops - values
    peak_bytes = grid.sum(axis=1)
    peaks = tops[:, -1]

    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    top = max(float(peaks.max()) / (1 - _ABOVE_BAR_PT / height_pt), capacity * 1.08)
    ax.set_ylim(0, top)
    ax.set_ylabel(f"Peak memory per GPU [{unit}]")
    points_per_unit = height_pt / top

    for j, component in enumerate(COMPONENTS):
        for i, (rectangle, text) in enumerate(zip(artists.bars[component],
                                                  artists.segment_labels[component])):
            rectangle.set_y(bottoms[i, j])
            rectangle.set_height(values[i, j])
            text.set_y(bottoms[i, j] + values[i, j] / 2)
            text.set_text(format_value(values[i, j]))
            text.set_visible(values[i, j] * points_per_unit >= _SEGMENT_LABEL_SIZE + 4)
        everywhere_zero = not grid[:, j].any()
        legend_text = artists.legend_text(component)
        legend_text.set_text(COMPONENT_LABELS[component] + (": 0 here" if everywhere_zero else ""))
        legend_text.set_color(_ZERO_EVERYWHERE if everywhere_zero else "#000000")

    for i, stage in enumerate(stages):
        fits = bool(peak_bytes[i] <= device.capacity)
        artists.peak_labels[stage].set_y(peaks[i])
        artists.peak_labels[stage].set_text(f"{format_value(peaks[i])} {unit}")
        artists.verdict_labels[stage].set_y(peaks[i])
        artists.verdict_labels[stage].set_text("fits" if fits else "too big")
        artists.verdict_labels[stage].set_color(OKABE_ITO["bluish green"] if fits else DEVICE_COLOR)
        # The two labels span _ABOVE_BAR_PT points above the bar; where the capacity line runs
        # through them, they get a white backing (only then: each backing costs a patch).
        crossing = peaks[i] <= capacity <= peaks[i] + _ABOVE_BAR_PT / points_per_unit
        for text in (artists.peak_labels[stage], artists.verdict_labels[stage]):
            if crossing != (text.get_bbox_patch() is not None):
                text.set_bbox(dict(_PEAK_LABEL_BACKING) if crossing else None)

    artists.device_tag.set_y(capacity)
    artists.device_tag.set_text(f"{format_value(capacity)} {unit}")
    _show_device_and_titles(artists, device, unit, capacity,
                            will_it_fit_titles(model, gpus, settings, layout))


def draw_will_it_fit(ax, frame: pd.DataFrame, device: "str | Device" = "a100-80gb", unit: str = "GB",
                     settings: WorkingSetSettings = DEFAULT_SETTINGS,
                     layout: "str | Layout" = "mixed-adam") -> WillItFitArtists:
    """One stacked bar per stage: persistent state, then each working-set term, to the peak.

    ``frame`` is ``zerolib.core.working_set.peak_frame(model, gpus, stages, settings, layout)``; the
    dashed line is the device's capacity (also written at the line's right end, in ``unit``).
    Above each bar: its peak and whether it fits (peak <= capacity, in bytes).
    """
    stages = _check_peak_frame(frame, settings, layout)[2]
    check_unit(unit)
    get_device(device)
    figure = ax.figure
    with style():
        x = np.arange(len(stages), dtype=float)
        bars, segment_labels = {}, {}
        for component in COMPONENTS:
            bars[component] = ax.bar(x, np.zeros(len(stages)), _STACK_WIDTH, bottom=0,
                                     color=COMPONENT_COLORS[component], edgecolor="white",
                                     linewidth=0.8, label=COMPONENT_LABELS[component], zorder=3)
            segment_labels[component] = [
                ax.text(xi, 0, "", ha="center", va="center", fontsize=_SEGMENT_LABEL_SIZE,
                        color=_ink(COMPONENT_COLORS[component]), zorder=4, clip_on=True)
                for xi in x]
        value_at = offset_copy(ax.transData, figure, y=3, units="points")
        verdict_at = offset_copy(ax.transData, figure, y=17, units="points")
        peak_labels = {stage: ax.text(xi, 0, "", transform=value_at, ha="center", va="bottom",
                                      fontsize=10, fontweight="bold", color="#222222", zorder=6,
                                      clip_on=True)
                       for xi, stage in zip(x, stages)}
        verdict_labels = {stage: ax.text(xi, 0, "", transform=verdict_at, ha="center",
                                         va="bottom", fontsize=10, zorder=6, clip_on=True)
                          for xi, stage in zip(x, stages)}
        device_line = ax.axhline(0, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=5,
                                 label=device_label(device, unit))
        at_line_end = offset_copy(blended_transform_factory(ax.transAxes, ax.transData), figure,
                                  x=_TAG_OFFSET_PT, units="points")
        device_tag = ax.text(1, 0, "", transform=at_line_end, ha="left", va="center", fontsize=10,
                             fontweight="bold", color=DEVICE_COLOR, clip_on=False)

        # Right of the axes: the device line, then the components in the order the stack reads
        # from the top, in two groups. Two legends, so that a new device or unit re-draws the
        # one-line legend only (the explorer re-uses the pixels of the other).
        legend_style = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0), "frameon": False,
                        "handlelength": 2.2, "borderaxespad": 0.0, "labelspacing": 0.45}
        device_legend = Legend(ax, [device_line], [device_label(device, unit)],
                               bbox_transform=offset_copy(ax.transAxes, figure, x=_LEGEND_OFFSET_PT,
                                                          units="points"), **legend_style)
        ax.add_artist(device_legend)

        def header(text):
            return Line2D([], [], linestyle="none", label=text)
        working = [c for c in reversed(COMPONENTS) if c not in CATEGORIES]
        persistent = [c for c in reversed(COMPONENTS) if c in CATEGORIES]
        entries = ([("header", header("Working set (per GPU)"))]
                   + [(c, bars[c]) for c in working]
                   + [("header", header("Persistent model state (per GPU)"))]
                   + [(c, bars[c]) for c in persistent])
        below_device = offset_copy(ax.transAxes, figure, x=_LEGEND_OFFSET_PT, y=-24, units="points")
        legend = ax.legend(handles=[handle for _, handle in entries], bbox_transform=below_device,
                           **legend_style)
        for (kind, _), text in zip(entries, legend.get_texts()):
            if kind == "header":
                text.set_fontweight("bold")
        legend_index = {kind: i for i, (kind, _) in enumerate(entries) if kind != "header"}

        title, subtitle = _make_titles(ax, "", "")
        under_axes = offset_copy(blended_transform_factory(ax.transData, ax.transAxes), figure,
                                 y=-6, units="points")
        stage_labels = {stage: ax.text(xi, 0, _wrap_strategy(stage), transform=under_axes,
                                       ha="center", va="top", fontsize=10, clip_on=False)
                        for xi, stage in zip(x, stages)}
        ax.set_xticks(x)
        ax.set_xlim(-0.6, len(stages) - 0.4)
        ax.tick_params(axis="x", length=0, labelbottom=False)
        ax.tick_params(axis="y", length=0, labelsize=10)   # the grid lines mark the values
        ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
        _fix_axis_labels(ax)
        artists = WillItFitArtists(ax, stages, bars, segment_labels, peak_labels, verdict_labels,
                                   stage_labels, device_line, device_tag, device_legend, legend,
                                   legend_index, title, subtitle)
        _apply_will_it_fit(artists, frame, device, unit, settings, layout)
    return artists


def will_it_fit_blocks(artists: WillItFitArtists) -> list:
    """:func:`text_blocks` plus the device legend and the strategy names under the bars
    (the blocks :class:`IncrementalPng` re-uses while they are unchanged)."""
    return [*text_blocks(artists), artists.device_legend, *artists.stage_labels.values()]


def update_will_it_fit(artists: WillItFitArtists, frame: pd.DataFrame,
                       device: "str | Device" = "a100-80gb", unit: str = "GB",
                       settings: WorkingSetSettings = DEFAULT_SETTINGS,
                       layout: "str | Layout" = "mixed-adam") -> WillItFitArtists:
    """Redraw the same artists for a new frame, device, unit or settings (nothing re-created)."""
    with style():
        _apply_will_it_fit(artists, frame, device, unit, settings, layout)
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


def will_it_fit_figure(frame: pd.DataFrame, device="a100-80gb", unit="GB",
                       settings: WorkingSetSettings = DEFAULT_SETTINGS, layout="mixed-adam",
                       dpi: float = 100) -> tuple[Figure, WillItFitArtists]:
    """A new Figure of :data:`WILL_IT_FIT_FIGSIZE` with :func:`draw_will_it_fit` drawn."""
    figure = new_figure(WILL_IT_FIT_FIGSIZE, dpi)
    artists = draw_will_it_fit(add_axes(figure, "will_it_fit"), frame, device, unit, settings, layout)
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


# ---------------------------------------------------------------------------------------------
# Measured against predicted, per rank (notebook 05: a real sharded run beside zerolib)

MEASURED_COLUMNS = ("panel", "stage", "rank", "category", "measured_bytes", "predicted_bytes",
                    "relative_difference")
PREDICTION_COLOR = OKABE_ITO["black"]
# Inches: each panel's axes, and the fixed margins around and between them.
_MEASURED_PANEL = (4.7, 2.45)
_MEASURED_MARGINS = {"left": 0.95, "right": 0.25, "between": 1.0, "top": 0.95, "title": 0.62,
                     "below": 0.62, "legend": 0.6}
_RELATIVE_LABEL_SIZE = 8  # points


def format_relative(relative: float) -> str:
    """A relative difference for reading: '0%', '+0.0048%', '+0.12%', '-31.4%', '+262%'."""
    if not math.isfinite(relative):
        return str(relative)
    if relative == 0:
        return "0%"
    if abs(relative) < 0.01:  # two significant digits: a few bytes in 100 kB still show
        return f"{relative * 100:+.2g}%"
    if abs(relative) < 1:
        return f"{relative:+.1%}"
    return f"{relative:+.0%}"


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
    if not isinstance(table, pd.DataFrame):
        raise TypeError("table must be a DataFrame from zerolib.crosscheck.validation.report.rank_bars, "
                        f"got {type(table).__name__}")
    missing = [c for c in MEASURED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks the columns {', '.join(missing)} "
                         "(use zerolib.crosscheck.validation.report.rank_bars)")
    if table.empty:
        raise ValueError("table must have at least one row")
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
                        zorder=5, bbox=dict(_LABEL_BACKING))
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
