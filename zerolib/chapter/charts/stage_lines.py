"""One line per ZeRO stage against a count of GPUs, each labelled with its value at the right
end, and the device's capacity dashed: what the GPU-count and the group-size figures share.

:func:`draw_stage_lines` creates the artists (empty); :func:`show_stage_lines` sets them for new
values. Each figure sets its own x axis and titles.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import offset_copy

from zerolib.chapter.style import (
    DEVICE_COLOR,
    STRATEGY_COLORS,
    STRATEGY_MARKERS,
    device_label,
    fix_axis_labels,
    legend_below,
    make_titles,
    plain_number,
)
from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.units import format_value

# How far an end label's centre stays from the capacity line, in points: half a 10-point
# label's height, half the line's width and a gap, so the line never runs through a label.
_LINE_CLEAR_PT = 9


@dataclass(eq=False)
class StageLineArtists:
    """What :func:`draw_stage_lines` drew."""

    ax: object
    stages: tuple[int, ...]
    lines: dict                 # stage -> Line2D
    end_labels: dict            # stage -> Text: the value at the right end
    device_line: object         # Line2D at the capacity
    legend: object
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(self.stages)]


def spread(values, gap: float, line: float | None = None, clear: float = 0.0,
           bottom: float = -np.inf) -> list[float]:
    """Label heights: each value, pushed apart so neighbours are at least ``gap`` apart, and,
    when a reference ``line`` is given, at least ``clear`` from it (labels at or above the line
    go above it, the others below), so that no label is written on the line; none lower than
    ``bottom`` (a label's lowest centre, clear of the x axis and its tick labels). Labels under
    the line that do not all fit between ``bottom`` and the line go above it."""
    placed = np.array(values, dtype=float)
    floor = -np.inf if line is None else line + clear
    above = placed >= (-np.inf if line is None else line)
    if line is not None and (~above).any() and line - clear - ((~above).sum() - 1) * gap < bottom:
        above[:] = True
    previous = -np.inf
    for i in np.argsort(placed, kind="stable"):
        if above[i]:
            placed[i] = max(placed[i], floor, bottom, previous + gap)
            previous = placed[i]
    previous = np.inf
    for i in np.argsort(-placed, kind="stable"):
        if not above[i]:
            placed[i] = min(placed[i], line - clear, previous - gap)
            previous = placed[i]
    previous = -np.inf
    for i in np.argsort(placed, kind="stable"):     # lifted off the bottom, in order, gaps kept
        if not above[i]:
            placed[i] = max(placed[i], bottom, previous + gap)
            previous = placed[i]
    return list(placed)


def draw_stage_lines(ax, stages: tuple[int, ...], device, unit: str) -> StageLineArtists:
    """Empty lines, end labels, the device line, the legend below and the titles (call inside
    :func:`zerolib.chapter.style.style`)."""
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
    legend = legend_below(ax, [*lines.values(), device_line], ncol=2)
    title, subtitle = make_titles(ax, "", "")
    ax.tick_params(labelsize=10)
    ax.tick_params(axis="y", length=0)       # the grid lines mark the values
    ax.yaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
    fix_axis_labels(ax)
    return StageLineArtists(ax, stages, lines, end_labels, device_line, legend, title, subtitle)


def show_stage_lines(artists: StageLineArtists, x, values: dict, unit: str, capacity: float):
    """Each stage's values against ``x``, the y range up to the largest value or the capacity,
    and each line's last value labelled at its end (pushed apart where they would overlap)."""
    for stage, line in artists.lines.items():
        line.set_data(x, values[stage])
    top = max(max(float(v.max()) for v in values.values()), capacity) * 1.1
    artists.ax.set_ylim(0, top)
    artists.ax.set_ylabel(f"Model state per GPU [{unit}]")
    last = {stage: float(values[stage][-1]) for stage in artists.stages}
    height_pt = artists.ax.get_position().height * artists.ax.figure.get_figheight() * 72
    # No label lower than its own half height and a gap above the x axis: there it would meet
    # the axis line (which then reads as a minus sign) or the last tick's label.
    heights = spread([last[s] for s in artists.stages], gap=0.045 * top, line=capacity,
                     clear=_LINE_CLEAR_PT / height_pt * top, bottom=_LINE_CLEAR_PT / height_pt * top)
    for stage, height in zip(artists.stages, heights):
        artists.end_labels[stage].set_position((int(x[-1]), height))
        artists.end_labels[stage].set_text(f"{format_value(last[stage])} {unit}")
