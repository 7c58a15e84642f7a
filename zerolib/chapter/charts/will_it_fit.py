"""Figure: will it fit? The peak per GPU, stage by stage, as stacked bars against the device.

:func:`draw_will_it_fit` draws a :func:`zerolib.core.memory.tables.peak_frame` (persistent state, then
each working-set term, per stage) and returns the artists; :func:`update_will_it_fit` changes
the same artists for a new frame, device or unit. The model, settings and layout named in the
title come from the frame's ``attrs``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import blended_transform_factory, offset_copy

from zerolib.chapter.charts.tidy import check_tidy, single_value, stages_of
from zerolib.chapter.style import (
    DEVICE_COLOR,
    OKABE_ITO,
    add_axes,
    device_label,
    fix_axis_labels,
    ink,
    labels_clear_of_line,
    make_titles,
    new_figure,
    plain_number,
    show_device_and_titles,
    style,
)
from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.accounting import CATEGORIES, STRATEGY_NAMES, Layout
from zerolib.core.memory.tables import COMPONENTS, PEAK_COLUMNS
from zerolib.core.memory.trainer_peak import summed
from zerolib.core.memory.working_set import WorkingSetSettings
from zerolib.core.units import GB, GiB, check_unit, format_value

FIGSIZE = (10.4, 6.0)  # inches
MARGINS = (0.95, 4.35, 0.8, 0.8)  # left, right (capacity tag, then the legend), bottom, top

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
RECOMPUTE_WORDS = MappingProxyType({"none": "no recomputation", "selective": "selective recomputation",
                                    "full": "full recomputation",
                                    "op-selective": "op-level selective recomputation"})
_COMPONENT_INDEX = MappingProxyType({c: i for i, c in enumerate(COMPONENTS)})
_STACK_WIDTH = 0.62
_SEGMENT_LABEL_SIZE = 9        # points (10 px in the explorer); a segment shows its value when at least 12 points tall
_ZERO_EVERYWHERE = "#777777"   # legend text of a component that is 0 in every bar drawn
# Room above the tallest bar for its two label lines (value, verdict), in points.
_ABOVE_BAR_PT = 36
_SEGMENT_LINE_CLEAR_PT = 1.5   # half the capacity line's width and a little: the line clears a label
# The capacity tag sits right of the axes at the line's height; the legend starts beyond it.
_TAG_OFFSET_PT, _LEGEND_OFFSET_PT = 6, 72


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


def will_it_fit_titles(model: str, gpus: int, settings: WorkingSetSettings,
                       layout: Layout) -> tuple[str, str]:
    """The figure's title (model, GPUs) and subtitle (every setting that shapes the bars)."""
    title = f"Will it fit? Peak memory per GPU of {model} on {gpus:,} {'GPU' if gpus == 1 else 'GPUs'}"
    parts = [f"sequence {settings.seq_len:,}", f"micro-batch {settings.micro_batch:,}",
             RECOMPUTE_WORDS[settings.recompute],
             "flash attention" if settings.flash_attention else "attention scores stored (no flash)"]
    if settings.tensor_parallel != 1:
        parts.append(f"{settings.tensor_parallel}-way tensor parallel"
                     + (" + sequence parallel" if settings.sequence_parallel else ""))
    if settings.pipeline_parallel != 1:
        parts.append(f"{settings.pipeline_parallel} pipeline stages ({settings.pipeline_schedule})")
    if not summed(settings.convention):   # an engine whose count is not the chapter's: named
        parts.append(f"{settings.engine}'s memory")
    parts += [name for name, on in (("fp8", settings.fp8), ("compiled", settings.compile)) if on]
    parts += [f"{layout.name} ({layout.total:g} bytes/param)",
              f"reserve {_size_words(settings.reserve_bytes)}"]
    return title, " · ".join(parts)


def _check_peak_frame(frame):
    """(model name, gpus, stages, bytes grid [stage, component]) of a ``peak_frame``."""
    made_by = "zerolib.core.memory.tables.peak_frame"
    frame = check_tidy(frame, PEAK_COLUMNS, (), made_by)
    models = frame["model"].unique()
    if len(models) != 1:
        raise ValueError(f"frame must hold one model for the will-it-fit figure, got {len(models)}")
    gpus = single_value(frame, "gpus", "will-it-fit")
    # (after the one run's columns: frames of two runs joined keep no attrs, their peaks differ)
    check_tidy(frame, PEAK_COLUMNS, ("model", "settings", "layout"), made_by)
    stages = stages_of(frame)
    component = frame["component"].map(_COMPONENT_INDEX)
    if (component.isna().any() or len(frame) != len(stages) * len(COMPONENTS)
            or frame.duplicated(["stage", "component"]).any()):
        raise ValueError(f"frame must hold every component exactly once for every stage (use {made_by})")
    grid = np.zeros((len(stages), len(COMPONENTS)), dtype=np.int64)
    grid[np.searchsorted(stages, frame["stage"].to_numpy()),
         component.to_numpy(dtype=np.int64)] = frame["bytes"].to_numpy(dtype=np.int64)
    return str(models[0]), gpus, stages, grid


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


def _segment_label_at(bottom: float, value: float, line: float, points_per_unit: float):
    """Where a segment's value label goes: its middle, or, when the capacity line would run
    through the label there, the part of the segment above or below the line if the label
    fits in it; None when it fits nowhere (the label is hidden)."""
    half = (_SEGMENT_LABEL_SIZE + 4) / 2 / points_per_unit   # half the label's height, and a gap
    clear = half + _SEGMENT_LINE_CLEAR_PT / points_per_unit
    top, middle = bottom + value, bottom + value / 2
    if value < 2 * half:
        return None
    if abs(middle - line) >= clear:
        return middle
    if top - max(bottom, line + clear - half) >= 2 * half:     # room above the line
        return max(line + clear, bottom + half)
    if min(top, line - clear + half) - bottom >= 2 * half:     # room below it
        return min(line - clear, top - half)
    return None


def judged_peaks(frame, stages, sums) -> list[tuple[int, str]]:
    """Per stage (bytes, what it is): the peak the engine judges (the frame's ``peaks``,
    estimate's), or the bar's sum where the frame carries none (the chapter's count)."""
    known = frame.attrs.get("peaks") or {}
    out = []
    for stage, total in zip(stages, sums):
        row = known.get(stage)
        out.append((int(total), "peak") if row is None else (int(row[row["fits_judges"]]),
                                                             row["fits_judges"]))
    return out


def _apply_will_it_fit(artists: WillItFitArtists, frame, device, unit):
    ax = artists.ax
    model, gpus, stages, grid = _check_peak_frame(frame)
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
    label_at, top = labels_clear_of_line(peaks, capacity, top, _ABOVE_BAR_PT / height_pt)
    ax.set_ylim(0, top)
    ax.set_ylabel(f"Peak memory per GPU [{unit}]")
    points_per_unit = height_pt / top

    for j, component in enumerate(COMPONENTS):
        for i, (rectangle, text) in enumerate(zip(artists.bars[component],
                                                  artists.segment_labels[component])):
            rectangle.set_y(bottoms[i, j])
            rectangle.set_height(values[i, j])
            at = _segment_label_at(bottoms[i, j], values[i, j], capacity, points_per_unit)
            text.set_y(bottoms[i, j] + values[i, j] / 2 if at is None else at)
            text.set_text(format_value(values[i, j]))
            text.set_visible(at is not None)
        everywhere_zero = not grid[:, j].any()
        legend_text = artists.legend_text(component)
        legend_text.set_text(COMPONENT_LABELS[component] + (": 0 here" if everywhere_zero else ""))
        legend_text.set_color(_ZERO_EVERYWHERE if everywhere_zero else "#000000")

    judged = judged_peaks(frame, stages, peak_bytes)
    for i, stage in enumerate(stages):
        value, judges = judged[i]
        fits = bool(value <= device.capacity)
        artists.peak_labels[stage].set_y(label_at[i])
        shown = peaks[i] if value == peak_bytes[i] else value / scale   # the bar's own top, as ever
        artists.peak_labels[stage].set_text(f"{format_value(shown)} {unit}"
                                            + (" reserved" if judges == "peak_reserved" else ""))
        artists.verdict_labels[stage].set_y(label_at[i])
        artists.verdict_labels[stage].set_text("fits" if fits else "too big")
        artists.verdict_labels[stage].set_color(OKABE_ITO["bluish green"] if fits else DEVICE_COLOR)

    artists.device_tag.set_y(capacity)
    artists.device_tag.set_text(f"{format_value(capacity)} {unit}")
    show_device_and_titles(artists, device, unit, capacity,
                            will_it_fit_titles(model, gpus, frame.attrs["settings"],
                                               frame.attrs["layout"]))


def draw_will_it_fit(ax, frame: pd.DataFrame, device: str | Device = "a100-80gb",
                     unit: str = "GB") -> WillItFitArtists:
    """One stacked bar per stage: persistent state, then each working-set term, to the peak.

    ``frame`` is :func:`zerolib.core.memory.tables.peak_frame` (its ``attrs`` name the settings); the
    dashed line is the device's capacity (also written at the line's right end, in ``unit``).
    Above each bar: the peak its engine judges (the bar's sum under the chapter's count; the
    reserved peak, so named, under torchtitan's) and whether it fits (at most the capacity).
    """
    stages = _check_peak_frame(frame)[2]
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
                        color=ink(COMPONENT_COLORS[component]), zorder=4, clip_on=True)
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

        title, subtitle = make_titles(ax, "", "")
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
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        fix_axis_labels(ax)
        artists = WillItFitArtists(ax, stages, bars, segment_labels, peak_labels, verdict_labels,
                                   stage_labels, device_line, device_tag, device_legend, legend,
                                   legend_index, title, subtitle)
        _apply_will_it_fit(artists, frame, device, unit)
    return artists


def will_it_fit_blocks(artists: WillItFitArtists) -> list:
    """The slow-changing text blocks (titles, legends, axis labels, the strategy names under the
    bars) that a fast renderer may re-use while they are unchanged."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.xaxis.label, ax.yaxis.label,
            artists.device_legend, *artists.stage_labels.values()]


def update_will_it_fit(artists: WillItFitArtists, frame: pd.DataFrame,
                       device: str | Device = "a100-80gb", unit: str = "GB") -> WillItFitArtists:
    """Redraw the same artists for a new frame, device or unit (nothing is re-created)."""
    with style():
        _apply_will_it_fit(artists, frame, device, unit)
    return artists


def will_it_fit_figure(frame: pd.DataFrame, device: str | Device = "a100-80gb", unit: str = "GB",
                       dpi: float = 100) -> tuple[Figure, WillItFitArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_will_it_fit` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_will_it_fit(add_axes(figure, MARGINS), frame, device, unit)
    return figure, artists
