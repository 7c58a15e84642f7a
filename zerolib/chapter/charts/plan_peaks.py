"""Figure: the planner's frontier, its peak per GPU against step time and the capacity line.

:func:`draw_plan_peaks` draws :attr:`zerolib.core.planner.Plan.valid` (one row per runnable
configuration, with ``attrs["plan"]`` its settings) into an Axes and returns the artists;
:func:`update_plan_peaks` changes the same artists for another plan or unit. Thousands of
configurations overplot one another, so the figure draws prominently only the **frontier**
(:func:`frontier`): the configurations no other is both faster than and smaller in peak, that is
the fastest for each peak, joined as a staircase and coloured by the parallelism each combines
(hollow where it does not fit). Every other runnable configuration is a small faded grey point.
Below the dashed capacity line a configuration's peak fits (the peak its engine judges: the
reserved peak under torchtitan's convention, :func:`judged_column`). The peak axis is logarithmic: peaks
run from a few tens of GB to terabytes. The fastest configuration that fits (the planner's
first, always on the frontier) is ringed and labelled, and so is any configuration the caller
names; each label sits on its point's side of the capacity line, never across it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.style import (
    DEVICE_COLOR,
    LABEL_BACKING,
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
REST_COLOR = "#9a9a9a"                # the faded rest: grey, see-through, so density shows
FRONTIER_COLOR = "#333333"
BEST_LABEL = "fastest that fits"
LABEL_SIZE = 10                       # points: 11 px at the explorers' 80 dpi
LABEL_OFFSET = 7                      # points from a labelled point to its label
LEADER_GAP = 8                        # points: a leader starts at the ring's edge
_TICKS = np.array([1, 2, 5]) * 10.0 ** np.arange(-3, 7)[:, None]


def _check(frame) -> pd.DataFrame:
    return check_tidy(frame, ("rank", *FIT_COLUMNS), ("plan",),
                      "zerolib.core.planner.Plan.valid")


def frontier(step, peak) -> np.ndarray:
    """The positions of the Pareto set of (``step``, ``peak``): the rows no other row is both at
    most as slow and at most as large as, and strictly better in one. Fastest first (ties:
    smaller peak, then position); rows equal in both are all kept. Non-finite rows are left out.

    One sort, then a running minimum: a row is on the frontier exactly when its peak is below
    every strictly faster row's and it is the smallest of the rows as fast as it."""
    step, peak = np.asarray(step, dtype=float), np.asarray(peak, dtype=float)
    if step.shape != peak.shape or step.ndim != 1:
        raise ValueError(f"step and peak must be 1-D arrays of one length, got shapes "
                         f"{step.shape} and {peak.shape}")
    finite = np.flatnonzero(np.isfinite(step) & np.isfinite(peak))
    order = finite[np.lexsort((finite, peak[finite], step[finite]))]
    s, p = step[order], peak[order]
    if not len(order):
        return order
    first = np.searchsorted(s, s, side="left")          # where each row's equal steps begin
    lowest = np.minimum.accumulate(p)
    faster = np.where(first > 0, lowest[np.maximum(first - 1, 0)], np.inf)
    return order[(p < faster) & (p == p[first])]


# The peak each point is drawn at: the one fits judges (the engine's convention), so the capacity
# line parts what fits from what does not.
JUDGED_AXIS = MappingProxyType({"peak": "Peak", "peak_reserved": "Reserved peak"})


def judged_column(settings) -> str:
    """The plan frame's column of the peak fits judges under ``settings`` (a PlanSettings)."""
    return "peak_reserved_bytes" if settings.working_set.convention.judges == "peak_reserved" \
        else "peak_bytes"


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
    rest: object            # PathCollection: every runnable configuration off the frontier
    frontier_line: object   # Line2D: the frontier as a staircase
    points: dict            # family -> PathCollection of its frontier configurations
    best: object            # the ring around the fastest configuration that fits
    best_label: object      # its label
    best_leader: object     # Line2D from the ring to its label, where the label stands off
    named: list             # (Text, leader) per configuration the caller named, in order
    device_line: object
    legend: object
    title: object
    subtitle: object

    @property
    def device_legend_text(self):
        return self.legend.get_texts()[len(FAMILIES) + 3]


def _ticks(low: float, high: float) -> np.ndarray:
    ticks = _TICKS.ravel()
    inside = ticks[(ticks >= low) & (ticks <= high)]
    return inside if len(inside) >= 3 else ticks[(ticks >= low / 10) & (ticks <= high * 10)]


def _named_rows(frame: pd.DataFrame, named) -> dict:
    """``named`` checked: label -> position in ``frame`` (it maps labels to index labels)."""
    if named is None:
        return {}
    if not isinstance(named, Mapping) or not all(isinstance(k, str) for k in named):
        raise TypeError(f"named must map label strings to index labels of the frame, got {named!r}")
    rows = {}
    for label, key in named.items():
        if key not in frame.index:
            raise ValueError(f"named[{label!r}] must be an index label of the frame, got {key!r}")
        rows[label] = int(frame.index.get_loc(key))
    return rows


# Where a label may go around its point: (dx, dy) in units of LABEL_OFFSET, ha, va; the
# first with the least in its way wins.
_SPOTS = ((-1, 0, "right", "center"), (-1, -1, "right", "top"), (0, -1.4, "center", "top"),
          (1, -1, "left", "top"), (1, 0, "left", "center"), (-1, 1, "right", "bottom"),
          (0, 1.4, "center", "bottom"), (1, 1, "left", "bottom"))


def _label_place(ax, text: str, x: float, y: float, line: float, marks: np.ndarray,
                 steps: np.ndarray) -> tuple:
    """Where a point's label goes: (dx, dy in points, ha, va). Always on the point's side of
    the capacity ``line`` and inside the axes; of those spots, the one over the fewest frontier
    points (``marks``, data coordinates) and staircase segments (``steps``: its vertices).
    Pure arithmetic on the limits; the text's width is estimated (0.62 em a character)."""
    (x0, x1), (b, t) = ax.get_xlim(), ax.get_ylim()
    width = ax.bbox.width * 72 / ax.figure.dpi            # the axes in points
    height = ax.bbox.height * 72 / ax.figure.dpi
    log = math.log(t / b)

    def pts(xs, ys):
        xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        return (xs - x0) / (x1 - x0) * width, np.log(ys / b) / log * height
    (px,), (py,) = pts([x], [y])
    (_,), (pl,) = pts([x], [line])
    mx, my = pts(marks[:, 0], marks[:, 1]) if len(marks) else (np.empty(0), np.empty(0))
    sx, sy = pts(steps[:, 0], steps[:, 1]) if len(steps) else (np.empty(0), np.empty(0))
    wide, tall, pad = 0.62 * LABEL_SIZE * len(text) + 4, LABEL_SIZE * 1.5, 4
    back = LABEL_BACKING["pad"] * LABEL_SIZE               # the white backing around the text
    below = y <= line

    def under(at):          # the staircase's height at ``at`` (points), infinite left of it
        return sy[np.searchsorted(sx, at, side="right") - 1] if len(sx) and at >= sx[0] else np.inf
    if below and abs(under(px) - py) < 0.5:
        # Under the staircase nothing runs (every configuration is above or right of it): a
        # label of a point on it goes there, joined by a leader, clear of every point and the
        # line.
        left = min(max(px - 0.3 * wide, back), width - wide - back)
        top = min(under(left + wide + back), py - 2.2 * LABEL_OFFSET) - pad - back
        if top - tall - back >= 0 and left >= back:
            return left - px, top - py, "left", "top"
    best, chosen = None, None
    for kx, ky, ha, va in _SPOTS:
        dx, dy = kx * LABEL_OFFSET, ky * LABEL_OFFSET
        left = px + dx - {"right": wide, "center": wide / 2, "left": 0}[ha]
        low = py + dy - {"top": tall, "center": tall / 2, "bottom": 0}[va]
        right, high = left + wide, low + tall
        if left < back or right > width - back or low < back or high > height - back:
            continue
        if (high + back > pl) if below else (low - back < pl):
            continue
        over = int(np.sum((mx > left - pad) & (mx < right + pad) & (my > low - pad)
                          & (my < high + pad)))
        # The staircase runs from vertex i right to i+1's x, then down to its y.
        if len(sx) > 1:
            ax_, ay, bx, by = sx[:-1], sy[:-1], sx[1:], sy[1:]
            flat = (ay > low) & (ay < high) & (np.minimum(ax_, bx) < right) & (np.maximum(ax_, bx) > left)
            drop = (bx > left) & (bx < right) & (np.minimum(ay, by) < high) & (np.maximum(ay, by) > low)
            over += int(np.sum(flat | drop))
        if best is None or over < best:
            best, chosen = over, (dx, dy, ha, va)
            if over == 0:
                break
    if chosen is None:     # nowhere clear of the line inside the axes: away from the line
        chosen = (-LABEL_OFFSET, -LABEL_OFFSET if below else LABEL_OFFSET, "right",
                  "top" if below else "bottom")
    return chosen


def _place(text, leader, ax, x: float, y: float, line: float, marks, steps):
    dx, dy, ha, va = _label_place(ax, text.get_text(), x, y, line, marks, steps)
    text.xy = (x, y)
    text.set_position((dx, dy))
    text.set_horizontalalignment(ha)
    text.set_verticalalignment(va)
    text.set_visible(True)
    # A leader where the label stands off (beside its point it needs none), from the ring's
    # edge to the label's corner, in axes fractions (worked out here: a patch clipped to the
    # label's box would cost a bezier split on every draw).
    far = math.hypot(dx, dy)
    leader.set_visible(far > 2 * LABEL_OFFSET)
    if far > 2 * LABEL_OFFSET:
        (x0, x1), (b, t) = ax.get_xlim(), ax.get_ylim()
        width, height = (v * 72 / ax.figure.dpi for v in (ax.bbox.width, ax.bbox.height))
        fx, fy = (x - x0) / (x1 - x0), math.log(y / b) / math.log(t / b)
        start = LEADER_GAP / far
        leader.set_data([fx + start * dx / width, fx + dx / width],
                        [fy + start * dy / height, fy + dy / height])


def _label(ax, text: str):
    label = ax.annotate(text, (0, 0), xytext=(0, 0), textcoords="offset points",
                        fontsize=LABEL_SIZE, color="#111111", zorder=7, visible=False,
                        bbox=dict(LABEL_BACKING))
    leader, = ax.plot([], [], color="#111111", lw=0.8, transform=ax.transAxes, zorder=6.5,
                      visible=False)
    return label, leader


def _apply(artists: PlanPeaksArtists, frame: pd.DataFrame, unit: str, rows: dict):
    ax = artists.ax
    s = frame.attrs["plan"]
    scale = check_unit(unit)
    capacity = s.device.capacity / scale
    step = frame["step_seconds"].to_numpy(dtype=float)
    peak = frame[judged_column(s)].to_numpy(dtype=float) / scale
    fits = frame["fits"].to_numpy(dtype=bool)
    family = frame["family"].astype(str).to_numpy()
    on = frontier(step, peak)
    off = np.ones(len(frame), dtype=bool)
    off[on] = False
    artists.rest.set_offsets(np.column_stack([step[off], peak[off]]))
    artists.frontier_line.set_data(step[on], peak[on])
    for name in FAMILIES:
        sel = on[family[on] == name]
        artists.points[name].set_offsets(np.column_stack([step[sel], peak[sel]]))
        # Filled where it fits, hollow (white inside) where it does not.
        artists.points[name].set_facecolors(
            [FAMILY_COLORS[name] if f else "white" for f in fits[sel]] or FAMILY_COLORS[name])
    if len(frame):
        low, high = float(step.min()), float(step.max())
        pad = max(high - low, 0.05 * high) * 0.06
        ax.set_xlim(low - pad, high + pad)
        # Room under the frontier, where nothing runs, for the labels.
        bottom = min(float(peak.min()), capacity) / 2
        top = max(float(peak.max()), capacity) * 1.25
    else:
        ax.set_xlim(0, 1)
        bottom, top = capacity / 4, capacity * 4
    ax.set_ylim(bottom, top)
    ax.yaxis.set_major_locator(FixedLocator(_ticks(bottom, top)))
    marks = np.column_stack([step[on], peak[on]])
    best = np.flatnonzero(frame["rank"].to_numpy() == 1)
    if len(best):
        x, y = float(step[best[0]]), float(peak[best[0]])
        artists.best.set_offsets([[x, y]])
        _place(artists.best_label, artists.best_leader, ax, x, y, capacity, marks, marks)
    else:
        artists.best.set_offsets(np.empty((0, 2)))
        artists.best_label.set_visible(False)
        artists.best_leader.set_visible(False)
    for (text, leader), at in zip(artists.named, rows.values()):
        _place(text, leader, ax, float(step[at]), float(peak[at]), capacity, marks, marks)
    ax.set_xlabel("Estimated step time [s] (a model, not a measurement)")
    ax.set_ylabel(f"{JUDGED_AXIS[s.working_set.convention.judges]} per GPU [{unit}], log scale")
    show_device_and_titles(artists, s.device, unit, capacity, plan_titles(frame))


def draw_plan_peaks(ax, frame: pd.DataFrame, unit: str = "GB",
                    named: Mapping | None = None) -> PlanPeaksArtists:
    """The frontier at (step time, peak per GPU) over every other configuration faded, the
    capacity dashed, the fastest that fits ringed. ``named`` maps labels to index labels of
    ``frame``: configurations to label too (e.g. ``{"ZeRO-3 alone": 17}``)."""
    frame = _check(frame)
    check_unit(unit)
    rows = _named_rows(frame, named)
    s = frame.attrs["plan"]
    with style():
        ax.set_yscale("log")
        rest = ax.scatter([], [], s=5, color=REST_COLOR, alpha=0.35, linewidths=0, zorder=2,
                          label="every other configuration")
        frontier_line, = ax.plot([], [], drawstyle="steps-post", color=FRONTIER_COLOR, lw=1.3,
                                 zorder=3)
        points = {name: ax.scatter([], [], s=34, marker=FAMILY_MARKERS[name],
                                   color=FAMILY_COLORS[name], edgecolors=FAMILY_COLORS[name],
                                   linewidths=1.1, label=name, zorder=4) for name in FAMILIES}
        best = ax.scatter([], [], s=190, facecolors="none", edgecolors="#111111", linewidths=1.6,
                          zorder=6, label="the fastest that fits")
        device_line = ax.axhline(1, color=DEVICE_COLOR, ls=(0, (5, 3)), lw=1.8, zorder=5,
                                 label=device_label(s.device, unit))
        line_handle = Line2D([], [], drawstyle="steps-post", color=FRONTIER_COLOR, lw=1.3,
                             label="the frontier (hollow: does not fit)")
        legend = legend_below(ax, [*points.values(), rest, line_handle, best, device_line],
                              ncol=3)
        for handle in legend.legend_handles[len(FAMILIES):len(FAMILIES) + 1]:
            handle.set_alpha(0.8)         # the faded rest's sample, visible in the legend
        title, subtitle = make_titles(ax, "", "")
        ax.grid(axis="x", color="#eeeeee")
        ax.tick_params(labelsize=10)
        ax.tick_params(axis="y", length=0)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=7, steps=[1, 2, 2.5, 5, 10]))
        ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.yaxis.set_minor_locator(NullLocator())
        fix_axis_labels(ax)
        # The labels last: drawn over everything, in the caller's order.
        best_label, best_leader = _label(ax, BEST_LABEL)
        texts = [_label(ax, label) for label in rows]
        artists = PlanPeaksArtists(ax, rest, frontier_line, points, best, best_label,
                                   best_leader, texts, device_line, legend, title, subtitle)
        _apply(artists, frame, unit, rows)
    return artists


def update_plan_peaks(artists: PlanPeaksArtists, frame: pd.DataFrame, unit: str = "GB",
                      named: Mapping | None = None) -> PlanPeaksArtists:
    """Redraw the same artists for a new plan or unit; ``named`` as :func:`draw_plan_peaks`'s
    (its labels replace those drawn before)."""
    frame = _check(frame)
    rows = _named_rows(frame, named)
    with style():
        if list(rows) != [text.get_text() for text, _ in artists.named]:
            for text, leader in artists.named:
                text.remove()
                leader.remove()
            artists.named = [_label(artists.ax, label) for label in rows]
        _apply(artists, frame, unit, rows)
    return artists


def plan_peaks_figure(frame: pd.DataFrame, unit: str = "GB", dpi: float = 100,
                      named: Mapping | None = None) -> tuple[Figure, PlanPeaksArtists]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_plan_peaks` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    artists = draw_plan_peaks(add_axes(figure, MARGINS), frame, unit, named)
    return figure, artists


def plan_peaks_blocks(artists: PlanPeaksArtists) -> list:
    """The slow-changing text blocks a fast renderer may re-use while they are unchanged."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.xaxis.label, ax.yaxis.label,
            artists.best_label]
