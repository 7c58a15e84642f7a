"""Figure: per-GPU model state of several model sizes at one GPU count, as grouped bars.

:func:`draw_memory_vs_model_size` draws a :func:`zerolib.core.memory.tables.memory_table` of one GPU
count into an Axes (log scale, a value label on every bar) and returns the artists;
:func:`update_memory_vs_model_size` changes the same artists for a new table, device or unit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator
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
    a_or_an,
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
from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.memory.tables import COLUMNS
from zerolib.core.units import check_unit, format_count, format_value

FIGSIZE = (9.0, 5.8)  # inches
MARGINS = (0.95, 0.25, 1.4, 0.8)  # left, right, bottom, top (inches)


def _check(table) -> pd.DataFrame:
    return check_tidy(table, COLUMNS, ("layout",), "zerolib.core.memory.tables.memory_table")


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
        what = f"{a_or_an(format_count(int(params[0])))}-parameter model {on}"
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


_VALUE_LABEL_SIZE = 9  # points
# A value label the capacity line would run through starts this far above the line instead
# (points: half the line's width and a gap), read as the bar's value like the others.
_LINE_CLEAR_PT = 3
_LONGEST_LABEL_PT = 34   # a rotated "1,120" and its gap above the bar


def _label_span(ax, height: float, text: str, line: float) -> tuple[float, float, float]:
    """Where the rotated value label above a bar of ``height`` starts and ends, and where the
    line at ``line`` is, in points above the axes' bottom.

    On the log axis a label starts 2 points above its bar and is about 0.64 em per character
    long (DejaVu Sans digits), so this is arithmetic on the axes' points per decade.
    """
    low, high = ax.get_ylim()
    per_decade = (ax.get_position().height * ax.figure.get_figheight() * 72
                  / math.log10(high / low))
    start = (math.log10(max(height, low)) - math.log10(low)) * per_decade + 2
    end = start + len(text) * 0.64 * _VALUE_LABEL_SIZE
    at = (math.log10(max(line, low)) - math.log10(low)) * per_decade
    return start, end, at


def _crosses(ax, height: float, text: str, line: float) -> bool:
    """Whether the rotated value label above a bar of ``height`` reaches the line at ``line``."""
    start, end, at = _label_span(ax, height, text, line)
    return start - _LINE_CLEAR_PT <= at <= end + _LINE_CLEAR_PT


def _above_line(ax, line: float) -> float:
    """The height (data units) at which a label starts :data:`_LINE_CLEAR_PT` above the line."""
    low, high = ax.get_ylim()
    per_decade = (ax.get_position().height * ax.figure.get_figheight() * 72
                  / math.log10(high / low))
    return line * 10 ** (_LINE_CLEAR_PT / per_decade)


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


def _apply_model_size(artists: ModelSizeArtists, table, device, unit):
    ax = artists.ax
    gpus = single_value(table, "gpus", "model-size")
    if stages_of(table) != artists.stages:
        raise ValueError(f"table must hold the stages {artists.stages} drawn first")
    params, values = totals_by_stage(table, "params", unit)
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
    room = max(0.3, _LONGEST_LABEL_PT * span / (height_pt - _LONGEST_LABEL_PT))
    ax.set_ylim(low, positive.max() * 10**room)
    ax.set_ylabel(f"Model state per GPU [{unit}] (log scale)")

    show_labels = _labels_fit(ax, len(params), len(artists.stages))
    texts = {stage: [format_value(height) for height in values[stage]] for stage in artists.stages}
    crossing = {stage: [show_labels and _crosses(ax, height, text, capacity)
                        for height, text in zip(values[stage], texts[stage])]
                for stage in artists.stages}
    if any(any(flags) for flags in crossing.values()):
        # A label moved above the line must end inside the axes: the top grows when it must
        # (solved on the log axis: the line's height plus the label's, in points).
        needed = _LINE_CLEAR_PT + 2 + _LONGEST_LABEL_PT
        at, bottom = math.log10(max(capacity, low)), math.log10(low)
        top = max(math.log10(ax.get_ylim()[1]),
                  (at * height_pt - needed * bottom) / (height_pt - needed))
        ax.set_ylim(low, 10**top)
        crossing = {stage: [show_labels and _crosses(ax, height, text, capacity)
                            for height, text in zip(values[stage], texts[stage])]
                    for stage in artists.stages}
    above = _above_line(ax, capacity)
    for stage in artists.stages:
        for text, height, label, moved in zip(artists.value_labels[stage], values[stage],
                                              texts[stage], crossing[stage]):
            text.set_y(max(above, height) if moved else height)
            text.set_text(label)
            text.set_visible(show_labels)

    show_device_and_titles(artists, device, unit, capacity,
                            _model_size_titles(gpus, params, table.attrs['layout']))


def draw_memory_vs_model_size(ax, table: pd.DataFrame, device: str | Device = "a100-80gb",
                              unit: str = "GB") -> ModelSizeArtists:
    """Grouped bars: per-GPU model state of each model under each stage, on a log scale.

    ``table`` holds one GPU count (:func:`zerolib.core.memory.tables.memory_table`, whose ``attrs`` name the layout).
    """
    table = _check(table)
    single_value(table, "gpus", "model-size")
    check_unit(unit)
    stages = stages_of(table)
    with style():
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_minor_locator(NullLocator())  # decades suffice: every bar carries its value
        device_line = ax.axhline(1, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=5,
                                 label=device_label(device, unit))
        artists = ModelSizeArtists(ax, stages, {}, {}, device_line, None, None, None)
        _make_bars(artists, len(np.unique(table["params"])))
        artists.params = tuple(np.unique(table["params"]).tolist())
        artists.legend = legend_below(ax, [*artists.bars.values(), device_line], ncol=2)
        artists.title, artists.subtitle = make_titles(ax, "", "")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", which="both", length=0)   # the grid lines mark the decades
        ax.tick_params(axis="x", length=0, labelsize=11)
        fix_axis_labels(ax)
        _apply_model_size(artists, table, device, unit)
    return artists


def update_memory_vs_model_size(artists: ModelSizeArtists, table: pd.DataFrame,
                                device: str | Device = "a100-80gb", unit: str = "GB") -> ModelSizeArtists:
    """Redraw for a new table, device or unit: new bar heights, labels, line and limits."""
    table = _check(table)
    with style():
        _apply_model_size(artists, table, device, unit)
    return artists


def model_size_figure(table: pd.DataFrame, device: str | Device = "a100-80gb", unit: str = "GB",
                      dpi: float = 100) -> tuple[Figure, ModelSizeArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_memory_vs_model_size` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_memory_vs_model_size(add_axes(figure, MARGINS), table, device, unit)
    return figure, artists
