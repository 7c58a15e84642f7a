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
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator
from matplotlib.transforms import offset_copy

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
_MARGINS = {"gpu_count": (0.85, 0.95, 1.55, 0.8), "model_size": (0.85, 0.25, 1.5, 0.8)}

# matplotlib settings for drawing and saving, applied with rc_context (never globally).
STYLE: Mapping[str, object] = MappingProxyType({
    "font.family": "DejaVu Sans",      # bundled with matplotlib: the same glyphs everywhere
    "font.size": 11,
    "axes.titlesize": 13,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
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
        raise TypeError(f"table must be a DataFrame from zerolib.curves.memory_table, got {type(table).__name__}")
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
    wide = table.pivot(index=index_column, columns="stage", values="total").sort_index()
    if wide.isna().to_numpy().any():
        raise ValueError(f"table must hold every stage at every {index_column} value")
    index = wide.index.to_numpy()
    return index, {int(stage): wide[stage].to_numpy(dtype=float) / scale for stage in wide.columns}


def _set_titles(ax, title_text, subtitle_text, title: str, subtitle: str):
    title_text.set_text(title)
    subtitle_text.set_text(subtitle)


def _make_titles(ax, title: str, subtitle: str):
    # The subtitle sits just above the axes; the title is padded to sit above the subtitle.
    title_text = ax.set_title(title, loc="left", pad=24, fontweight="bold", fontsize=12.5)
    subtitle_text = ax.text(0, 1.0, subtitle, transform=offset_copy(ax.transAxes, ax.figure, y=7,
                                                                     units="points"),
                            ha="left", va="bottom", fontsize=10, color="#333333")
    return title_text, subtitle_text


def _legend(ax, handles, ncol: int):
    return ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol,
                     frameon=False, handlelength=2.6, columnspacing=1.8)


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
    span = f"{gpus[0]} GPU" if len(gpus) == 1 else f"{gpus[0]} to {gpus[-1]} GPUs"
    return (f"Per-GPU model-state memory of a {format_count(params)}-parameter model, {span}",
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

    _set_titles(ax, artists.title, artists.subtitle, *_gpu_count_titles(params, gpus, layout))
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
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
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
    sizes = (format_count(int(params[0])) if len(params) == 1
             else f"{format_count(int(params[0]))} to {format_count(int(params[-1]))}")
    noun = "GPU" if gpus == 1 else "GPUs"
    return (f"Per-GPU model-state memory of {sizes}-parameter models on {gpus} {noun}",
            layout_summary(layout))


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
                    va="bottom", fontsize=8, color="#222222", zorder=4)
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

    show_labels = _labels_fit(ax, len(params), len(artists.stages))
    for stage in artists.stages:
        heights = values[stage]
        for rectangle, text, height in zip(artists.bars[stage], artists.value_labels[stage], heights):
            rectangle.set_height(height)
            text.set_y(height)
            text.set_text(format_value(height))
            text.set_visible(show_labels)

    x = np.arange(len(params))
    ax.set_xticks(x, [format_count(int(p)) for p in params])
    ax.set_xlim(-0.6, len(params) - 0.4)
    ax.set_xlabel(f"Model size (parameters), each trained on {gpus} data-parallel "
                  f"{'GPU' if gpus == 1 else 'GPUs'}")

    # Log scale: the values span several decades (0.25 GB to 1,120 GB in the chapter's figure).
    everything = np.concatenate([*values.values(), [capacity]])
    positive = everything[everything > 0]
    low = 10 ** math.floor(math.log10(positive.min()) - 0.15) if positive.size else 0.1
    high = 10 ** math.ceil(math.log10(positive.max()) + 0.55) if positive.size else 10.0
    ax.set_ylim(low, high)
    ax.set_ylabel(f"Model state per GPU [{unit}] (log scale)")

    artists.device_line.set_ydata([capacity, capacity])
    artists.device_line.set_label(device_label(device, unit))
    artists.device_legend_text.set_text(device_label(device, unit))
    _set_titles(ax, artists.title, artists.subtitle, *_model_size_titles(gpus, params, layout))
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
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        ax.grid(axis="x", visible=False)
        device_line = ax.axhline(1, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=5,
                                 label=device_label(device, unit))
        artists = ModelSizeArtists(ax, stages, {}, {}, device_line, None, None, None)
        _make_bars(artists, len(np.unique(table["params"])))
        artists.params = tuple(np.unique(table["params"]).tolist())
        artists.legend = _legend(ax, [*artists.bars.values(), device_line], ncol=3)
        artists.title, artists.subtitle = _make_titles(ax, "", "")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="x", length=0, labelsize=11)
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
