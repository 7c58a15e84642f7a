"""Figure: one training step per strategy, as a timeline of compute and collectives.

:func:`draw_step_timeline` draws a :func:`zerolib.core.step.tables.timeline_frame`: per
strategy two lanes, the GPU's compute (forward, backward, waiting for the network) and the
network (each collective of the schedule, with its bytes per GPU), placed in time by the
overlap model of :mod:`zerolib.core.step.time`. The model, GPUs, interconnect, compute settings
and the engine whose schedule it is named in the titles come from the frame's ``attrs``.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.transforms import blended_transform_factory, offset_copy

from zerolib.chapter.charts.tidy import check_tidy
from zerolib.chapter.charts.tradeoff import engine_words
from zerolib.chapter.charts.will_it_fit import TOL_MUTED
from zerolib.chapter.style import (
    STRATEGY_COLORS,
    add_axes,
    fix_axis_labels,
    gpus_text,
    ink,
    legend_below,
    make_titles,
    new_figure,
    plain_number,
    style,
)
from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.step.collectives import KIND_LABELS
from zerolib.core.step.tables import TIMELINE_COLUMNS
from zerolib.core.step.traffic import SLOTS
from zerolib.core.units import GB, format_count, format_value

FIGSIZE = (11.0, 6.4)   # inches
MARGINS = (2.5, 1.3, 1.35, 1.0)  # left (strategy names), right (step time), bottom, top (titles)
LANE_HEIGHT = 0.34
LANE_OFFSET = 0.2      # compute lane above the row's centre, network lane below
# Compute in the cool colours, the three collectives in warm ones, waiting in pale grey
# (Paul Tol's "muted" scheme, as the will-it-fit figure; the strategies keep their own colours).
BLOCK_COLORS: Mapping[str, str] = MappingProxyType({
    "forward": TOL_MUTED["cyan"], "backward": TOL_MUTED["indigo"],
    "waiting": TOL_MUTED["pale grey"], "all_reduce": TOL_MUTED["wine"],
    "reduce_scatter": TOL_MUTED["sand"], "all_gather": TOL_MUTED["teal"],
})
_KIND = {slot.name: slot.kind for slot in SLOTS}
_LABEL_SIZE = 8               # points
_CHAR_WIDTH = 0.6             # of the font size: DejaVu Sans is at most this wide on average


def _color(block: str) -> str:
    if block.startswith("waiting"):
        return BLOCK_COLORS["waiting"]
    return BLOCK_COLORS.get(block) or BLOCK_COLORS[_KIND[block]]


def _block_text(row, milliseconds: float) -> str:
    """Two lines: what the block is, then its time (compute) or bytes sent per GPU (network)."""
    if row.lane == "compute":
        what = "waiting" if row.block.startswith("waiting") else row.block
        return f"{what}\n{format_value(milliseconds)} ms"
    kind = KIND_LABELS[_KIND[row.block]]
    calls = f" x {row.calls}" if row.calls > 1 else ""
    return f"{kind}{calls}\n{format_value(row.sent_bytes / GB)} GB"


def _fits(text: str, width_points: float) -> bool:
    longest = max(len(line) for line in text.splitlines())
    return longest * _CHAR_WIDTH * _LABEL_SIZE + 4 <= width_points


def step_timeline_titles(attrs: Mapping) -> tuple[str, str]:
    """The title (model, GPUs, device, whose schedule) and subtitle (interconnect, compute
    settings, layout)."""
    model = attrs["model"]
    name = model.name if hasattr(model, "name") else f"{format_count(model)}-parameter model"
    ic, compute, device = attrs["interconnect"], attrs["compute"], attrs["device"]
    title = (f"One training step of {name} on {attrs['gpus']:,} {device.label} under "
             f"{engine_words(attrs)}")
    where = ic.label
    if ic.gpus_per_node is not None:
        where = (f"{ic.name} nodes: {gpus_text(ic.gpus_per_node)} on {ic.intra.name} inside, "
                 f"{ic.nics} {ic.network.name} port{'s' if ic.nics > 1 else ''} out")
    subtitle = (f"{where} · bus bandwidth {format_value(attrs['bus_bandwidth'] / GB)} GB/s per GPU\n"
                f"{compute.tokens_per_gpu:,} tokens per GPU per step, "
                f"{compute.flops_per_param_token} FLOPs per multiplied parameter and token, "
                f"the attention core as well, at "
                f"{compute.mfu:.0%} of the peak · layout {attrs['layout'].name}")
    return title, subtitle


def draw_step_timeline(ax, frame: pd.DataFrame):
    """Two lanes per strategy (compute above, network below), blocks placed in time; the step
    time and the share spent waiting at the right. Returns the Axes."""
    made_by = "zerolib.core.step.tables.timeline_frame"
    frame = check_tidy(frame, TIMELINE_COLUMNS, ("model", "gpus", "interconnect", "device",
                                                 "compute", "layout", "bus_bandwidth",
                                                 "step_seconds"), made_by)
    stages = sorted(frame["stage"].unique())
    steps = frame.attrs["step_seconds"]
    longest_ms = max(steps.values()) * 1000
    figure = ax.figure
    with style():
        ax.set_xlim(0, longest_ms * 1.02)
        points_per_ms = (ax.get_position().width * figure.get_figwidth() * 72) / (longest_ms * 1.02)
        rows = {stage: len(stages) - 1 - i for i, stage in enumerate(stages)}  # stage 0 on top
        for row in frame.itertuples():
            start, end = row.start_seconds * 1000, row.end_seconds * 1000
            y = rows[row.stage] + (LANE_OFFSET if row.lane == "compute" else -LANE_OFFSET)
            color = _color(row.block)
            waiting = row.block.startswith("waiting")
            ax.barh(y, end - start, LANE_HEIGHT, left=start, color=color, zorder=3,
                    edgecolor="white" if not waiting else "#999999", linewidth=0.8,
                    hatch="///" if waiting else None)
            text = _block_text(row, end - start)
            if _fits(text, (end - start) * points_per_ms):
                ax.text((start + end) / 2, y, text, ha="center", va="center",
                        fontsize=_LABEL_SIZE, linespacing=1.05, color=ink(color), zorder=4,
                        clip_on=True)
        right = offset_copy(blended_transform_factory(ax.transAxes, ax.transData), figure, x=8,
                            units="points")
        left = offset_copy(blended_transform_factory(ax.transAxes, ax.transData), figure, x=-8,
                           units="points")
        for stage in stages:
            y = rows[stage]
            step_ms = steps[stage] * 1000
            waiting = frame[(frame["stage"] == stage)
                            & frame["block"].str.startswith("waiting")]
            wait_ms = float((waiting["end_seconds"] - waiting["start_seconds"]).sum() * 1000)
            sent = int(frame.loc[(frame["stage"] == stage), "sent_bytes"].sum())
            ax.text(1, y + 0.2, f"{format_value(step_ms)} ms", transform=right, ha="left",
                    va="center", fontsize=10, fontweight="bold", color="#222222")
            ax.text(1, y - 0.05, f"{wait_ms / step_ms:.0%} waiting", transform=right, ha="left",
                    va="center", fontsize=9, color="#555555")
            ax.text(1, y - 0.28, f"{format_value(sent / GB)} GB sent", transform=right,
                    ha="left", va="center", fontsize=9, color="#555555")
            ax.text(0, y + 0.1, STRATEGY_NAMES[stage], transform=left, ha="right",
                    va="center", fontsize=10, fontweight="bold", color=STRATEGY_COLORS[stage])
            ax.text(0, y - 0.2, "compute / network", transform=left, ha="right", va="center",
                    fontsize=8, color="#555555")
        ax.set_yticks([])
        ax.set_ylim(-0.6, len(stages) - 0.4)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
        ax.xaxis.set_major_formatter(FuncFormatter(plain_number))
        ax.set_xlabel("Time within one training step [ms]")
        ax.grid(axis="x", color="#e6e6e6")
        ax.grid(axis="y", visible=False)
        ax.tick_params(axis="x", labelsize=10)
        ax.spines["left"].set_visible(False)
        fix_axis_labels(ax)
        handles = [Patch(facecolor=BLOCK_COLORS[k], edgecolor="white", label=label) for k, label in (
            ("forward", "forward compute"), ("backward", "backward compute"),
            ("all_reduce", "all-reduce"), ("reduce_scatter", "reduce-scatter"),
            ("all_gather", "all-gather"))]
        handles.append(Patch(facecolor=BLOCK_COLORS["waiting"], edgecolor="#999999", hatch="///",
                             label="GPU waits for the network"))
        legend_below(ax, handles, ncol=3)
        title, subtitle = step_timeline_titles(frame.attrs)
        # A two-line subtitle: the title sits higher than make_titles puts it.
        _, subtitle_text = make_titles(ax, title, subtitle)
        ax.title.set_text("")
        ax.set_title(title, loc="left", y=1.0, pad=40, fontweight="bold", fontsize=12.5)
        subtitle_text.set_linespacing(1.3)
    return ax


def step_timeline_figure(frame: pd.DataFrame, dpi: float = 100) -> tuple[Figure, object]:
    """A new Figure of :data:`FIGSIZE` with :func:`draw_step_timeline` drawn."""
    figure = new_figure(FIGSIZE, dpi)
    ax = draw_step_timeline(add_axes(figure, MARGINS), frame)
    return figure, ax

