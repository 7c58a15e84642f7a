"""Figure: every configuration the planner can run, its peak per GPU against the capacity line.

:func:`draw_plan_peaks` draws :attr:`zerolib.core.planner.Plan.valid` (one row per runnable
configuration, with ``attrs["plan"]`` its settings) into an Axes and returns the artists;
:func:`update_plan_peaks` changes the same artists for another plan or unit. One point per
configuration at (estimated step time, peak per GPU), coloured by the parallelism it combines;
below the dashed capacity line it fits. The peak axis is logarithmic: peaks run from a few
tens of GB to terabytes. The fastest configuration that fits (the planner's first) is ringed;
the text beside the figure names it (text drawn in the axes would be redrawn on every change
of an explorer, the dearest part of a redraw).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.style import (
    DEVICE_COLOR,
    OKABE_ITO,
    add_axes,
    device_label,
    fix_axis_labels,
    legend_below,
    make_titles,
    new_figure,
    plain_number,
    show_device_and_titles,
    style,
)
from zerolib.core.planner import FAMILIES, FIT_COLUMNS
from zerolib.core.units import check_unit

FIGSIZE = (9.6, 6.4)                  # inches
MARGINS = (0.95, 0.35, 1.45, 0.8)     # left, right, bottom (legend), top
FAMILY_COLORS = {FAMILIES[0]: OKABE_ITO["reddish purple"], FAMILIES[1]: OKABE_ITO["sky blue"],
                 FAMILIES[2]: OKABE_ITO["orange"], FAMILIES[3]: OKABE_ITO["blue"]}
FAMILY_MARKERS = {FAMILIES[0]: "o", FAMILIES[1]: "s", FAMILIES[2]: "^", FAMILIES[3]: "D"}
_TICKS = np.array([1, 2, 5]) * 10.0 ** np.arange(-3, 7)[:, None]


def _check(frame) -> pd.DataFrame:
    return check_tidy(frame, ("rank", *FIT_COLUMNS), ("plan",),
                      "zerolib.core.planner.Plan.valid")


def plan_titles(frame: pd.DataFrame) -> tuple[str, str]:
    """The title (model, GPUs, device) and subtitle (what fits, the setting, the time model)."""
    s = frame.attrs["plan"]
    fits = frame["fits"].to_numpy()
    title = (f"Every runnable configuration of {s.model.name} on {s.gpus:,} {s.device.label}")
    subtitle = (f"{int(fits.sum()):,} of {len(frame):,} fit · sequence {s.seq_len:,}, global batch "
                f"{s.global_batch:,} · estimated at {s.mfu:.0%} of peak on {s.interconnect.name}")
    return title, subtitle


@dataclass(eq=False)
class PlanPeaksArtists:
    """What :func:`draw_plan_peaks` drew; :func:`update_plan_peaks` changes it."""

    ax: object
    points: dict            # family -> PathCollection
    best: object            # the ring around the fastest configuration that fits
    device_line: object
    legend: object
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(FAMILIES) + 1]


def _ticks(low: float, high: float) -> np.ndarray:
    ticks = _TICKS.ravel()
    inside = ticks[(ticks >= low) & (ticks <= high)]
    return inside if len(inside) >= 3 else ticks[(ticks >= low / 10) & (ticks <= high * 10)]


def _apply(artists: PlanPeaksArtists, frame: pd.DataFrame, unit: str):
    ax = artists.ax
    s = frame.attrs["plan"]
    scale = check_unit(unit)
    capacity = s.device.capacity / scale
    step = frame["step_seconds"].to_numpy(dtype=float)
    peak = frame["peak_bytes"].to_numpy(dtype=float) / scale
    family = frame["family"].astype(str).to_numpy()
    for name in FAMILIES:
        sel = family == name
        artists.points[name].set_offsets(np.column_stack([step[sel], peak[sel]]))
    if len(frame):
        low, high = float(step.min()), float(step.max())
        pad = max(high - low, 0.05 * high) * 0.06
        ax.set_xlim(low - pad, high + pad)
        bottom = min(float(peak.min()), capacity) / 1.25
        top = max(float(peak.max()), capacity) * 1.25
    else:
        ax.set_xlim(0, 1)
        bottom, top = capacity / 4, capacity * 4
    ax.set_ylim(bottom, top)
    ax.yaxis.set_major_locator(FixedLocator(_ticks(bottom, top)))
    best = frame[frame["rank"].to_numpy() == 1]
    if len(best):
        row = best.iloc[0]
        artists.best.set_offsets([[float(row["step_seconds"]), float(row["peak_bytes"]) / scale]])
    else:
        artists.best.set_offsets(np.empty((0, 2)))
    ax.set_xlabel("Estimated step time [s] (a model, not a measurement)")
    ax.set_ylabel(f"Peak per GPU [{unit}], log scale")
    show_device_and_titles(artists, s.device, unit, capacity, plan_titles(frame))


def draw_plan_peaks(ax, frame: pd.DataFrame, unit: str = "GB") -> PlanPeaksArtists:
    """One point per runnable configuration at (step time, peak per GPU), the capacity dashed."""
    frame = _check(frame)
    check_unit(unit)
    s = frame.attrs["plan"]
    with style():
        ax.set_yscale("log")
        points = {name: ax.scatter([], [], s=16, marker=FAMILY_MARKERS[name],
                                   color=FAMILY_COLORS[name], alpha=0.55, linewidths=0,
                                   label=name, zorder=3) for name in FAMILIES}
        best = ax.scatter([], [], s=190, facecolors="none", edgecolors="#111111", linewidths=1.6,
                          zorder=5, label="the fastest that fits (the planner's first)")
        device_line = ax.axhline(1, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=4,
                                 label=device_label(s.device, unit))
        legend = legend_below(ax, [*points.values(), best, device_line], ncol=3)
        for handle in legend.legend_handles[:len(FAMILIES)]:
            handle.set_alpha(1)
        title, subtitle = make_titles(ax, "", "")
        ax.grid(axis="x", color="#eeeeee")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", length=0)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_minor_locator(NullLocator())
        fix_axis_labels(ax)
        artists = PlanPeaksArtists(ax, points, best, device_line, legend, title, subtitle)
        _apply(artists, frame, unit)
    return artists


def update_plan_peaks(artists: PlanPeaksArtists, frame: pd.DataFrame,
                      unit: str = "GB") -> PlanPeaksArtists:
    """Redraw the same artists for a new plan or unit (nothing is re-created)."""
    frame = _check(frame)
    with style():
        _apply(artists, frame, unit)
    return artists


def plan_peaks_figure(frame: pd.DataFrame, unit: str = "GB",
                      dpi: float = 100) -> tuple[Figure, PlanPeaksArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_plan_peaks` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_plan_peaks(add_axes(figure, MARGINS), frame, unit)
    return figure, artists


def plan_peaks_blocks(artists: PlanPeaksArtists) -> list:
    """The slow-changing text blocks a fast renderer may re-use while they are unchanged."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.xaxis.label, ax.yaxis.label]
