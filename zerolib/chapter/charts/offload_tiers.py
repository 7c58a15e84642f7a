"""Figure: where the model state lives, one stacked bar per option (GPU, CPU memory, NVMe).

:func:`draw_offload_tiers` draws a :func:`zerolib.core.memory.tables.tier_table` (one model, one GPU
count, the options of :data:`zerolib.core.memory.placement.OPTIONS`) into an Axes and returns the
artists; :func:`update_offload_tiers` changes the same artists for a new table, device or unit.
Each bar is the model state one GPU owns, per tier, bottom to top: what stays in GPU memory,
what its process keeps in the node's CPU memory, what it keeps on NVMe. The dashed line is the
device's capacity, which only the GPU segment must stay under; above each bar, the GPU bytes
and whether they fit.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import blended_transform_factory, offset_copy

from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.charts.will_it_fit import TOL_MUTED
from zerolib.chapter.style import (
    DEVICE_COLOR,
    OKABE_ITO,
    add_axes,
    device_label,
    fix_axis_labels,
    gpus_text,
    ink,
    labels_clear_of_line,
    layout_summary,
    make_titles,
    new_figure,
    plain_number,
    show_device_and_titles,
    style,
)
from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.placement import TIERS
from zerolib.core.memory.tables import TIER_COLUMNS
from zerolib.core.units import check_unit, format_count, format_value

FIGSIZE = (12.0, 6.4)
MARGINS = (0.95, 3.5, 1.35, 0.8)   # right: the legend; bottom: the options' names
TIER_COLORS: Mapping[str, str] = MappingProxyType({
    "gpu": TOL_MUTED["indigo"], "cpu": TOL_MUTED["sand"], "nvme": TOL_MUTED["teal"]})
TIER_LABELS: Mapping[str, str] = MappingProxyType({
    "gpu": "GPU memory", "cpu": "CPU memory (host)", "nvme": "NVMe (host SSD)"})
_WIDTH = 0.64
_SEGMENT_LABEL_SIZE = 9   # points: 10 px in the explorer
_ABOVE_BAR_PT = 34


def _check(table) -> pd.DataFrame:
    return check_tidy(table, TIER_COLUMNS, ("params", "gpus", "gpus_on_node", "layout"),
                      "zerolib.core.memory.tables.tier_table")


def _grid(table) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(option names in order, bytes per GPU [option, tier], offered per option)."""
    options = list(pd.unique(table["option"]))
    tier_index = {t: i for i, t in enumerate(TIERS)}
    if len(table) != len(options) * len(TIERS) or table.duplicated(["option", "tier"]).any():
        raise ValueError("table must hold every tier exactly once for every option (use "
                         "zerolib.core.memory.tables.tier_table)")
    grid = np.zeros((len(options), len(TIERS)), dtype=np.int64)
    rows = table["option"].map({o: i for i, o in enumerate(options)}).to_numpy()
    grid[rows, table["tier"].map(tier_index).to_numpy()] = table["bytes"].to_numpy()
    offered = table.groupby("option", sort=False)["offered"].all().reindex(options).to_numpy()
    return options, grid, offered


def params_words(params: int) -> str:
    """A parameter count for a title: '70B', '1.5T'; '69.0B' rather than '68.9766B'."""
    text = format_count(params)
    if len(text) <= 5:
        return text
    scale, suffix = next((s, x) for s, x in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (1, ""))
                         if params >= s)
    return f"{format_value(params / scale)}{suffix}"


def offload_titles(table: pd.DataFrame) -> tuple[str, str]:
    a = table.attrs
    group = "" if a.get("shard_group") in (None, a["gpus"]) else f", shard group {a['shard_group']}"
    return (f"Where the state of {params_words(a['params'])} parameters on {gpus_text(a['gpus'])} "
            f"lives{group}",
            f"{layout_summary(a['layout'])}; per GPU, {gpus_text(a['gpus_on_node'])} per node")


@dataclass(eq=False)
class OffloadArtists:
    """What :func:`draw_offload_tiers` drew; :func:`update_offload_tiers` changes it."""

    ax: object
    options: tuple[str, ...]
    bars: dict              # tier -> BarContainer (one rectangle per option)
    segment_labels: dict    # tier -> texts inside the rectangles
    gpu_labels: list        # above each bar: bytes on the GPU
    verdict_labels: list    # above each bar: fits / too big / not offered
    option_labels: list     # under each bar: the option's name
    device_line: object
    legend: object
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(TIERS)]


def _apply(artists: OffloadArtists, table, device, unit):
    ax = artists.ax
    options, grid, offered = _grid(table)
    if tuple(options) != artists.options:
        raise ValueError(f"table must hold the options {artists.options} drawn first")
    scale = check_unit(unit)
    device = get_device(device)
    capacity = device.capacity / scale
    values = grid / scale
    tops = np.cumsum(values, axis=1)
    bottoms = tops - values
    height_pt = ax.get_position().height * ax.figure.get_figheight() * 72
    top = max(float(tops[:, -1].max()) / (1 - _ABOVE_BAR_PT / height_pt), capacity * 1.1)
    label_at, top = labels_clear_of_line(tops[:, -1], capacity, top, _ABOVE_BAR_PT / height_pt)
    ax.set_ylim(0, top)
    ax.set_ylabel(f"Model state one GPU owns [{unit}]")
    points_per_unit = height_pt / top
    for j, tier in enumerate(TIERS):
        for i, (rectangle, text) in enumerate(zip(artists.bars[tier], artists.segment_labels[tier])):
            rectangle.set_y(bottoms[i, j])
            rectangle.set_height(values[i, j])
            text.set_y(bottoms[i, j] + values[i, j] / 2)
            text.set_text(format_value(values[i, j]))
            text.set_visible(values[i, j] * points_per_unit >= _SEGMENT_LABEL_SIZE + 4)
    for i in range(len(options)):
        gpu = values[i, TIERS.index("gpu")]
        fits = bool(grid[i, TIERS.index("gpu")] <= device.capacity)
        artists.gpu_labels[i].set_y(label_at[i])
        artists.verdict_labels[i].set_y(label_at[i])
        if offered[i]:
            artists.gpu_labels[i].set_text(f"GPU {format_value(gpu)} {unit}")
            artists.verdict_labels[i].set_text("fits" if fits else "too big")
            artists.verdict_labels[i].set_color(OKABE_ITO["bluish green"] if fits else DEVICE_COLOR)
        else:
            artists.gpu_labels[i].set_text("")
            artists.verdict_labels[i].set_text("not offered")
            artists.verdict_labels[i].set_color("#777777")
    show_device_and_titles(artists, device, unit, capacity, offload_titles(table))


def _wrap(name: str) -> str:
    return "\n".join(textwrap.wrap(name, 15, break_on_hyphens=False))


def draw_offload_tiers(ax, table: pd.DataFrame, device: str | Device = "a100-80gb",
                       unit: str = "GB") -> OffloadArtists:
    """One stacked bar per option: GPU, CPU and NVMe bytes one GPU owns, the device dashed."""
    table = _check(table)
    options = _grid(table)[0]
    check_unit(unit)
    figure = ax.figure
    with style():
        x = np.arange(len(options), dtype=float)
        bars, segment_labels = {}, {}
        for tier in TIERS:
            bars[tier] = ax.bar(x, np.zeros(len(options)), _WIDTH, color=TIER_COLORS[tier],
                                edgecolor="white", linewidth=0.8, label=TIER_LABELS[tier], zorder=3)
            segment_labels[tier] = [ax.text(xi, 0, "", ha="center", va="center",
                                            fontsize=_SEGMENT_LABEL_SIZE,
                                            color=ink(TIER_COLORS[tier]), zorder=4, clip_on=True)
                                    for xi in x]
        value_at = offset_copy(ax.transData, figure, y=3, units="points")
        verdict_at = offset_copy(ax.transData, figure, y=16, units="points")
        gpu_labels = [ax.text(xi, 0, "", transform=value_at, ha="center", va="bottom", fontsize=9,
                              fontweight="bold", color="#222222", zorder=6) for xi in x]
        verdict_labels = [ax.text(xi, 0, "", transform=verdict_at, ha="center", va="bottom",
                                  fontsize=9, zorder=6) for xi in x]
        device_line = ax.axhline(0, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=5,
                                 label=device_label(device, unit))
        handles = [*(bars[t] for t in reversed(TIERS)), device_line]
        legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                           bbox_transform=offset_copy(ax.transAxes, figure, x=12, units="points"),
                           frameon=False, handlelength=2.2, borderaxespad=0.0)
        title, subtitle = make_titles(ax, "", "")
        under_axes = offset_copy(blended_transform_factory(ax.transData, ax.transAxes), figure,
                                 y=-6, units="points")
        option_labels = [ax.text(xi, 0, _wrap(name), transform=under_axes, ha="center", va="top",
                                 fontsize=9, clip_on=False) for xi, name in zip(x, options)]
        ax.set_xticks(x)
        ax.set_xlim(-0.6, len(options) - 0.4)
        ax.tick_params(axis="x", length=0, labelbottom=False)
        ax.tick_params(axis="y", length=0, labelsize=10)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        fix_axis_labels(ax)
        artists = OffloadArtists(ax, tuple(options), bars, segment_labels, gpu_labels,
                                 verdict_labels, option_labels, device_line, legend, title, subtitle)
        _apply(artists, table, device, unit)
    return artists


def offload_blocks(artists: OffloadArtists) -> list:
    """Slow-changing text blocks a fast renderer may re-use."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.yaxis.label, *artists.option_labels]


def update_offload_tiers(artists: OffloadArtists, table: pd.DataFrame,
                         device: str | Device = "a100-80gb", unit: str = "GB") -> OffloadArtists:
    """Redraw the same artists for a new table, device or unit."""
    table = _check(table)
    with style():
        _apply(artists, table, device, unit)
    return artists


def offload_tiers_figure(table: pd.DataFrame, device: str | Device = "a100-80gb", unit: str = "GB",
                         dpi: float = 100) -> tuple[Figure, OffloadArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_offload_tiers` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_offload_tiers(add_axes(figure, MARGINS), table, device, unit)
    return figure, artists
